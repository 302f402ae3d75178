"""Sampling from a TransformerXLLM: the prompt goes through the memory segment by
segment, then each new token costs one step against the memory (no recomputation of
the context). The token loop is one compiled `tf.function` (TensorFlow backend).

    python -m txl_keras.generate --model_dir=runs/quickstart --prompt="def main(" \
        --max_new_tokens=200 --temperature=0.8 --top_k=40 --seed=1
"""

import os

import numpy as np
import tensorflow as tf
from absl import app, flags


def _filter_logits(logits, temperature, top_k, top_p):
    logits = logits / temperature
    if top_k and top_k > 0:
        kth = tf.math.top_k(logits, k=top_k).values[:, -1:]
        logits = tf.where(logits < kth, -np.inf, logits)
    if top_p is not None and top_p < 1.0:
        ordered = tf.sort(logits, direction="DESCENDING", axis=-1)
        probs = tf.nn.softmax(ordered, axis=-1)
        before = tf.cumsum(probs, axis=-1, exclusive=True)
        kept = tf.where(before < top_p, ordered, np.inf)  # always keeps the most likely
        threshold = tf.reduce_min(kept, axis=-1, keepdims=True)
        logits = tf.where(logits < threshold, -np.inf, logits)
    return logits


def generate(model, prompt, max_new_tokens, temperature=1.0, top_k=0, top_p=1.0, seed=0,
             stop_token=None, mem_len=None, clamp_len=None, same_length=None):
    """Continue `prompt` (int `(batch, P)`, P >= 1) by `max_new_tokens` tokens.

    `temperature=0` is greedy decoding. `top_k > 0` keeps the k most likely tokens,
    `top_p < 1` the smallest set whose probability reaches p. Sampling is reproducible
    for a given `seed`. After a row emits `stop_token` it only repeats it, and the loop
    ends once every row has stopped. `mem_len` (default: the config's) bounds the
    context the model sees. Returns int32 `(batch, P + max_new_tokens)`.
    """
    config = model.config
    mem_len = config.mem_len if mem_len is None else mem_len
    prompt = tf.convert_to_tensor(np.asarray(prompt), tf.int32)
    if prompt.shape.rank != 2 or prompt.shape[1] < 1:
        raise ValueError(f"Expected `prompt` of shape (batch, length >= 1). Received shape {prompt.shape}")
    values = prompt.numpy()
    if values.min() < 0 or values.max() >= config.n_token:
        raise ValueError(f"Prompt ids must be in [0, n_token={config.n_token}).")
    batch = prompt.shape[0]
    overrides = dict(mem_len=mem_len, clamp_len=clamp_len, same_length=same_length, training=False)
    mems = [tf.zeros([batch, mem_len, config.d_model], model.compute_dtype)] * config.n_layer
    valid = tf.constant(mem_len if config.mem_init == "zeros" else 0, tf.int32)
    # With relative positions each new token projects only itself, not the whole memory.
    kvs = model.backbone.memory_kv(mems) if model.backbone.can_cache_kv and mem_len else None

    @tf.function
    def feed(tokens, mems, kvs, valid):
        out = model(tokens, mems=mems, memory_kv=kvs, memory_valid=valid, **overrides)
        return out["mems"], out.get("memory_kv"), out["memory_valid"]

    context = prompt[:, :-1]
    for start in range(0, context.shape[1], config.tgt_len):
        mems, kvs, valid = feed(context[:, start:start + config.tgt_len], mems, kvs, valid)

    greedy = temperature is None or temperature <= 0
    stop = -1 if stop_token is None else int(stop_token)

    @tf.function
    def decode(last, mems, kvs, valid):
        produced = tf.TensorArray(tf.int32, size=max_new_tokens)
        done = tf.zeros([batch], tf.bool)
        step = tf.constant(0)
        while step < max_new_tokens and not tf.reduce_all(done):
            out = model(last[:, None], mems=mems, memory_kv=kvs or None, memory_valid=valid, **overrides)
            mems, kvs, valid = out["mems"], out.get("memory_kv", []), out["memory_valid"]
            log_probs = model.softmax.log_probs(out["hidden"])[:, 0]
            if greedy:
                token = tf.argmax(log_probs, axis=-1, output_type=tf.int32)
            else:
                logits = _filter_logits(log_probs, temperature, top_k, top_p)
                token = tf.random.stateless_categorical(logits, 1, seed=tf.stack([seed, step]),
                                                        dtype=tf.int32)[:, 0]
            token = tf.where(done, stop, token)
            done = done | tf.equal(token, stop)
            produced = produced.write(step, token)
            last = token
            step += 1
        tokens = tf.transpose(produced.stack()[:step])
        return tokens, step

    new, count = decode(prompt[:, -1], mems, kvs or [], valid)  # [] for no cache: a loop variable
    count = int(count)
    if count < max_new_tokens:  # every row stopped early: pad with the stop token
        new = tf.concat([new, tf.fill([batch, max_new_tokens - count], stop)], axis=1)
    return tf.concat([prompt, new], axis=1).numpy()


FLAGS = flags.FLAGS


def define_flags():
    """The command line flags (defined only when run as a program)."""
    flags.DEFINE_string("model_dir", None, "Training folder (config.json, vocab.json, checkpoints).")
    flags.DEFINE_string("checkpoint", None, "Checkpoint folder (default: the latest).")
    flags.DEFINE_string("vocab", None, "vocab.json (default: the one in --model_dir).")
    flags.DEFINE_string("prompt", "", "Text to continue.")
    flags.DEFINE_integer("max_new_tokens", 200, "Tokens to generate.")
    flags.DEFINE_float("temperature", 1.0, "Sampling temperature (0: greedy).")
    flags.DEFINE_integer("top_k", 0, "Keep only the k most likely tokens (0: all).")
    flags.DEFINE_float("top_p", 1.0, "Nucleus sampling mass.")
    flags.DEFINE_integer("seed", 0, "Sampling seed.")
    flags.DEFINE_string("stop", None, "Stop symbol (e.g. <eos>).")
    flags.DEFINE_integer("mem_len", None, "Memory length (default: the config's).")
    flags.DEFINE_integer("clamp_len", None, "clamp_len for generation.")


def main(argv):
    del argv
    from tf_records.vocabulary import Vocabulary
    from txl_keras.export import load_trained_model

    if not FLAGS.model_dir:
        raise app.UsageError("--model_dir is required.")
    vocab = Vocabulary.load(FLAGS.vocab or os.path.join(FLAGS.model_dir, "vocab.json"))
    model = load_trained_model(FLAGS.model_dir, FLAGS.checkpoint)
    ids = vocab.encode_prompt(FLAGS.prompt)
    if len(ids) == 0:
        raise app.UsageError("--prompt encodes to no token; give some text.")
    stop = vocab.lookup(FLAGS.stop) if FLAGS.stop else None
    out = generate(model, ids[None], FLAGS.max_new_tokens, FLAGS.temperature, FLAGS.top_k, FLAGS.top_p,
                   FLAGS.seed, stop, FLAGS.mem_len, FLAGS.clamp_len)
    print(vocab.decode(out[0]))


if __name__ == "__main__":
    define_flags()
    app.run(main)
