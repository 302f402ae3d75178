"""SavedModel export with the memory carried explicitly in flat, named signatures.

    python -m txl_keras.export --model_dir=runs/quickstart --output=exported/quickstart

Signatures (every memory is `(batch, mem_len, d_model)`; `memory_valid` counts the real
slots, the rest are masked):
- `initial_memory(batch_size)` -> `mem_0 ... mem_{L-1}`, `memory_valid`
- `next_log_probs(tokens, memory_valid, mem_0 ...)` -> `log_probs` (of the last
  position, `(batch, n_token)`), `new_mem_0 ...`, `new_memory_valid`
- `score(tokens, targets, memory_valid, mem_0 ...)` -> `nll` `(batch, time)`,
  `new_mem_0 ...`, `new_memory_valid`
The result loads with `tf.saved_model.load` in a process without txl_keras.
"""

import json
import os

import keras
import tensorflow as tf
from absl import app, flags

from txl_keras.models.config import TransformerXLConfig
from txl_keras.models.transformer_xl_lm import TransformerXLLM


def _memory_specs(config, mem_len):
    return [tf.TensorSpec([None, mem_len, config.d_model], tf.float32, name=f"mem_{i}")
            for i in range(config.n_layer)]


def export_saved_model(model, path, mem_len=None, clamp_len=None, same_length=None):
    """Write `model` (a TransformerXLLM) as a SavedModel with explicit memory.

    `mem_len`, `clamp_len`, `same_length` default to the model's config (pass the
    evaluation settings to serve with a longer memory).
    """
    config = model.config
    mem_len = config.mem_len if mem_len is None else mem_len
    zero_init = config.mem_init == "zeros"
    overrides = dict(mem_len=mem_len, clamp_len=clamp_len, same_length=same_length)
    mem_specs = _memory_specs(config, mem_len)
    valid_spec = tf.TensorSpec([], tf.int32, name="memory_valid")
    tokens_spec = tf.TensorSpec([None, None], tf.int32, name="tokens")
    targets_spec = tf.TensorSpec([None, None], tf.int32, name="targets")

    def run(tokens, targets, memory_valid, mems):
        mems = [tf.cast(m, model.compute_dtype) for m in mems]
        out = model(tokens, targets=targets, mems=mems, memory_valid=memory_valid, training=False, **overrides)
        result = {f"new_mem_{i}": tf.cast(m, tf.float32) for i, m in enumerate(out["mems"])}
        result["new_memory_valid"] = tf.cast(out["memory_valid"], tf.int32)
        return out, result

    def initial_memory(batch_size):
        zeros = tf.zeros([batch_size, mem_len, config.d_model], tf.float32)
        result = {f"mem_{i}": zeros for i in range(config.n_layer)}
        result["memory_valid"] = tf.constant(mem_len if zero_init else 0, tf.int32)
        return result

    def next_log_probs(tokens, memory_valid, *mems):
        out, result = run(tokens, None, memory_valid, mems)
        result["log_probs"] = model.softmax.log_probs(out["hidden"][:, -1:])[:, 0]
        return result

    def score(tokens, targets, memory_valid, *mems):
        out, result = run(tokens, targets, memory_valid, mems)
        result["nll"] = out["nll"]
        return result

    archive = keras.export.ExportArchive()
    archive.track(model)
    archive.add_endpoint("initial_memory", tf.function(initial_memory),
                         input_signature=[tf.TensorSpec([], tf.int32, name="batch_size")])
    archive.add_endpoint("next_log_probs", tf.function(next_log_probs),
                         input_signature=[tokens_spec, valid_spec] + mem_specs)
    archive.add_endpoint("score", tf.function(score),
                         input_signature=[tokens_spec, targets_spec, valid_spec] + mem_specs)
    archive.write_out(path, verbose=False)
    with open(os.path.join(path, "txl_config.json"), "w") as f:
        json.dump({"config": config.to_dict(), "mem_len": mem_len}, f, indent=2)
    return path


def load_trained_model(model_dir, checkpoint=None, **model_kwargs):
    """A TransformerXLLM from a training folder (`config.json` + a checkpoint)."""
    from txl_keras.training.checkpoints import latest_checkpoint, weights_path

    path = os.path.join(model_dir, "config.json")
    if not os.path.exists(path):
        raise FileNotFoundError(f"No config.json in {model_dir}; is it a train_gpu.py --model_dir?")
    with open(path) as f:
        config = TransformerXLConfig.from_json(f.read())
    if checkpoint is None:
        _, checkpoint = latest_checkpoint(model_dir)
        if checkpoint is None:
            raise FileNotFoundError(f"No complete checkpoint in {model_dir}.")
    model = TransformerXLLM(config, **model_kwargs)
    model.build((None, config.tgt_len))
    model.load_weights(weights_path(checkpoint))
    return model


FLAGS = flags.FLAGS


def define_flags():
    """The command line flags (defined only when run as a program)."""
    flags.DEFINE_string("model_dir", None, "Training folder (config.json and checkpoints).")
    flags.DEFINE_string("checkpoint", None, "Checkpoint folder (default: the latest in --model_dir).")
    flags.DEFINE_string("output", None, "Where to write the SavedModel.")
    flags.DEFINE_integer("mem_len", None, "Memory length to serve with (default: the config's).")
    flags.DEFINE_integer("clamp_len", None, "clamp_len to serve with.")
    flags.DEFINE_bool("same_length", None, "same_length to serve with.")


def main(argv):
    del argv
    if not FLAGS.model_dir or not FLAGS.output:
        raise app.UsageError("--model_dir and --output are required.")
    model = load_trained_model(FLAGS.model_dir, FLAGS.checkpoint)
    export_saved_model(model, FLAGS.output, FLAGS.mem_len, FLAGS.clamp_len, FLAGS.same_length)
    print(f"wrote {FLAGS.output}")


if __name__ == "__main__":
    define_flags()
    app.run(main)
