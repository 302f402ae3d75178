"""SavedModel export with the memory carried explicitly in flat, named signatures.

    python -m txl_keras.export --model_dir=runs/quickstart --output=exported/quickstart

Signatures (`B` streams, `T` tokens; every layer's memory `mem_i` is float32 `(2 * n_head, B,
mem_len, d_head)`, the keys then the values of its rows in time order, heads first, as
generation and evaluation keep it (`InferenceCache`; absolute-position models: the hidden
states, `(1, B, mem_len, d_model)`), and `memory_valid` `(B,)` counts each row's real slots,
the newest; the rest are masked):
- `initial_memory(batch_size)` -> `mem_0 ... mem_{L-1}`, `memory_valid` `(B,)`: an empty
  memory. With a count per row, the rows of a batch may be at different places in their
  streams.
- `next_log_probs(tokens (B, T) int32, memory_valid, mem_0 ...)` -> `log_probs` `(B, n_token)`
  float32, the next token's log-probabilities after the last position only, and
  `new_mem_0 ...`, `new_memory_valid`: the memory after the segment.
- `score(tokens (B, T), targets (B, T), memory_valid, mem_0 ...)` -> `nll` `(B, T)` float32
  (nats), `new_mem_0 ...`, `new_memory_valid`.
- With a vocabulary: `encode(text)` -> `ids` `(N,)` int32
  (`TransformerXLTokenizer.tokenize_prompt`: an unfinished last line gets no closing
  `<eos>`), `decode(ids (N,))` -> `text` (`TransformerXLTokenizer.detokenize`: at word
  level each `<eos>` a line break), and `vocabulary()` -> `symbols` `(n_token,)` string
  and `settings`, a JSON string of its tokenisation rules; it is also the file
  `assets/vocab.json` (`tf_records.vocabulary.Vocabulary`'s format).
- `generate(prompts (N,) string, max_new_tokens, temperature, top_k, seed)` -> `texts` `(N,)`:
  the whole generation in the graph, each prompt as `TransformerXLCausalLM.generate`
  continues it alone, to the vocabulary's end symbol (`temperature` 0: greedy; `top_k` 0:
  every token; `max_new_tokens` at most `MAX_SERVED_NEW_TOKENS`, 4,096: the loop runs
  in the graph, where nothing stops it early). `serving_default` is `generate`: text in, text out in one call, what a
  server that knows nothing of the memory wants (without a vocabulary, `initial_memory`).
Token ids outside `[0, n_token)` and `memory_valid` outside `[0, mem_len]` are refused (an
`InvalidArgumentError` naming the argument). The attribute functions take the same
argument names as the signatures. The result loads with `tf.saved_model.load` in a process
without txl_keras. The output may be any `tf.io.gfile` path (local, gs://, ...).
"""

import json

import tensorflow as tf

from txl_io import files
from tf_records.vocabulary import VOCAB_FILE
from txl_keras import generate as generation
from txl_keras import samplers
from txl_keras.generate.loop import scored_segment, step_memory
from txl_keras.layers.inference_cache import InferenceCache
from txl_keras.tokenizers import TransformerXLTokenizer

EXPORT_INFO = "txl_config.json"
# The most new tokens one call of the SavedModel's `generate` makes: the whole loop runs in
# the graph, where nothing (Ctrl-C included) stops it before its end.
MAX_SERVED_NEW_TOKENS = 4096


def export_saved_model(model, path, vocabulary=None, mem_len=None, clamp_len=None, same_length=None):
    """Write `model` (a TransformerXLLM) as a SavedModel with explicit memory, and with
    `vocabulary` (a `tf_records.vocabulary.Vocabulary` of `n_token` symbols) its text
    signatures. `mem_len`, `clamp_len`, `same_length` default to the model's config (pass
    the evaluation settings to serve with a longer memory). The folder is written whole
    (`files.staged_folder`): a second export to `path` is refused, an interrupted one is
    finished by the same call."""
    path = files.user_path(path)
    files.check_new_folder(path)  # before minutes of tracing
    serving = model.config.with_memory(mem_len, clamp_len, same_length)
    if vocabulary is not None and len(vocabulary) != serving.n_token:
        raise ValueError(f"The vocabulary has {len(vocabulary)} symbols but the model has n_token="
                         f"{serving.n_token}; export it with the vocabulary its records were built with "
                         "(--vocab).")
    served = tf.__internal__.tracking.AutoTrackable()  # the weights, the tokenizer's table, the endpoints
    served.variables = list(model.variables)
    endpoints = {}
    if vocabulary is not None:
        tokenizer = TransformerXLTokenizer(vocabulary)
        served.table = tokenizer._table
        endpoints["generate"] = _generate_signature(model, serving, tokenizer)
        endpoints.update(_text_signatures(tokenizer))
    endpoints.update(_signatures(model, serving))
    # Each endpoint is traced once, without AutoGraph (the control flow is written as graph
    # ops), and saved as that concrete function: as an attribute and as its signature. A
    # `tf.function` would be traced again inside `tf.saved_model.save`, whose context is part
    # of the trace's key, doubling the export's time.
    signatures = {}
    for name, (function, spec) in endpoints.items():
        signatures[name] = tf.function(function, input_signature=spec, autograph=False).get_concrete_function()
        setattr(served, name, signatures[name])
    # `serving_default`: the first endpoint, `generate` (text in, text out) where there is a
    # vocabulary, else `initial_memory`.
    signatures["serving_default"] = signatures[next(iter(endpoints))]
    with files.staged_folder(path, "an export", last="saved_model.pb") as staging:
        with files.reporting(path):
            tf.saved_model.save(served, staging, signatures=signatures)
        if vocabulary is not None:
            vocabulary.save(files.join(staging, "assets", VOCAB_FILE))
        files.atomic_write(files.join(staging, EXPORT_INFO),
                           json.dumps({"config": model.config.to_dict(), "mem_len": serving.mem_len}, indent=2))
    return path


def _checked(ids, name, n_token):
    """`ids` after a check that each is in `[0, n_token)` (an InvalidArgumentError naming `name`)."""
    message = f"`{name}` must hold token ids in [0, n_token={n_token})"
    with tf.control_dependencies([tf.debugging.assert_non_negative(ids, message=message),
                                  tf.debugging.assert_less(ids, n_token, message=message)]):
        return tf.identity(ids)


def _signatures(model, serving):
    """`{name: (function, input_signature)}` of the memory endpoints. The memory crosses
    the interface as the `InferenceCache` generation and evaluation keep (the keys and
    values of the memory, projected once, in time order): a call projects only its own
    segment."""
    mem_len, n_token = serving.mem_len, serving.n_token
    overrides = step_memory(serving)
    groups, width = model.backbone.cache_layout
    mem_specs = [tf.TensorSpec([groups, None, mem_len, width], tf.float32, name=f"mem_{i}")
                 for i in range(serving.n_layer)]
    valid_spec = tf.TensorSpec([None], tf.int32, name="memory_valid")  # one count per row
    tokens_spec = tf.TensorSpec([None, None], tf.int32, name="tokens")
    targets_spec = tf.TensorSpec([None, None], tf.int32, name="targets")

    def run(forward, tokens, memory_valid, mems):
        """`forward(tokens, cache) -> (out, cache)` on the memory given: `(out, the new memory)`."""
        message = f"`memory_valid` must be in [0, mem_len={mem_len}]"
        with tf.control_dependencies([tf.debugging.assert_non_negative(memory_valid, message=message),
                                      tf.debugging.assert_less_equal(memory_valid, mem_len, message=message)]):
            memory_valid = tf.identity(memory_valid)
        cache = InferenceCache(tuple(tf.cast(m, model.compute_dtype) for m in mems), tf.zeros((), tf.int32),
                               memory_valid)
        out, cache = forward(_checked(tokens, "tokens", n_token), cache)
        cache = cache.map_rings(lambda ring: tf.ensure_shape(ring, [groups, None, mem_len, width]))
        result = {f"new_mem_{i}": tf.cast(cache.rows(i, mem_len), tf.float32) for i in range(serving.n_layer)}
        result["new_memory_valid"] = tf.cast(cache.valid, tf.int32)
        return out, result

    def initial_memory(batch_size):
        cache = model.init_cache(batch_size, mem_len, serving.clamp_len, segment_length=1)
        result = {f"mem_{i}": tf.cast(ring, tf.float32) for i, ring in enumerate(cache.rings)}
        result["memory_valid"] = tf.fill([batch_size], cache.valid)
        return result

    def last_log_probs(tokens, cache):
        out, cache = model.call_with_cache(tokens, cache, **overrides)
        return model.softmax.log_probs(out["hidden"][:, -1:])[:, 0], cache

    def next_log_probs(tokens, memory_valid, *mem):  # (*mem: the arguments are named mem_0, mem_1, ...)
        log_probs, result = run(last_log_probs, tokens, memory_valid, mem)
        result["log_probs"] = log_probs
        return result

    scorer = scored_segment(model, serving)  # what `TransformerXLCausalLM.score` reads a text with

    def score(tokens, targets, memory_valid, *mem):
        nll, result = run(lambda tokens, cache: scorer(tokens, _checked(targets, "targets", n_token), cache),
                          tokens, memory_valid, mem)
        result["nll"] = nll
        return result

    return {
        "initial_memory": (initial_memory, [tf.TensorSpec([], tf.int32, name="batch_size")]),
        "next_log_probs": (next_log_probs, [tokens_spec, valid_spec] + mem_specs),
        "score": (score, [tokens_spec, targets_spec, valid_spec] + mem_specs),
    }


def _text_signatures(tokenizer):
    """`encode`, `decode` and `vocabulary` endpoints: the `TransformerXLTokenizer`'s own
    functions (`tokenize_prompt`, `detokenize`), traced into the SavedModel."""
    vocabulary = tokenizer.vocabulary
    settings = {k: v for k, v in vocabulary.to_dict().items() if k != "symbols"}

    def encode(text):
        return {"ids": tokenizer.tokenize_prompt(text)}

    def decode(ids):
        return {"text": tokenizer.detokenize(_checked(ids, "ids", len(vocabulary)))}

    def symbols_of():
        return {"symbols": tf.constant(vocabulary.symbols), "settings": tf.constant(json.dumps(settings))}

    return {
        "encode": (encode, [tf.TensorSpec([], tf.string, name="text")]),
        "decode": (decode, [tf.TensorSpec([None], tf.int32, name="ids")]),
        "vocabulary": (symbols_of, []),
    }


class _ServedSampler(samplers.RandomSampler):
    """The sampler of the `generate` signature's inputs (tensors): greedy at `temperature`
    0, else `TopKSampler(top_k, temperature)` (`RandomSampler` at `top_k` 0), drawing as
    the library's samplers do. Only the branch asked for runs: no draws for greedy, no
    top-k without a `top_k`."""

    def __init__(self, temperature, top_k):
        self.temperature, self.top_k, self.seed = temperature, top_k, None

    def filter(self, logits):
        k = tf.minimum(self.top_k, tf.shape(logits)[-1])
        return tf.cond(self.top_k > 0, lambda: samplers.top_k_filter(logits, k), lambda: logits)

    def get_next_token(self, log_probs, keys):
        log_probs = tf.cast(log_probs, tf.float32)
        return tf.cond(self.temperature > 0, lambda: samplers.RandomSampler.get_next_token(self, log_probs, keys),
                       lambda: samplers.argmax(log_probs))


def _argument_check(condition, message, value):
    """An assertion whose error names the argument: `message`, then the value received."""
    return tf.debugging.Assert(condition, [f"Invalid argument of generate: {message}; received", value])


def _generate_signature(model, serving, tokenizer):
    """`generate(prompts, max_new_tokens, temperature, top_k, seed)` -> `texts`: the whole
    generation in the graph, each prompt as `TransformerXLCausalLM.generate` continues it
    alone (to the vocabulary's end symbol), strings in and out."""
    stop_ids = tf.constant([-1 if tokenizer.end_token_id is None else tokenizer.end_token_id], tf.int32)

    def one(prompt, max_new_tokens, sampler, seed):
        ids = tokenizer.tokenize_prompt(prompt)
        check = _argument_check(tf.size(ids) > 0, "each of `prompts` must encode to at least one token (an empty "
                                "prompt has nothing to continue)", prompt)
        with tf.control_dependencies([check]):  # every use of the ids waits for the check
            ids = tf.identity(ids)
        cache = model.init_cache(1, serving.mem_len, serving.clamp_len, segment_length=serving.tgt_len)
        cache = generation.feed_context(model, ids[None, :-1], cache, serving)
        cache = generation.ready_for_steps(model, cache, serving)
        state = sampler.begin(tf.reshape(ids[-1:], [1]), cache, tf.reshape(max_new_tokens, [1]), tf.reshape(seed, [1]))
        state, tokens, _, _ = sampler.search(generation.model_step(model, serving), state, max_new_tokens, stop_ids,
                                             max_new_tokens)
        new = tokens[0, :state.lengths[0]]  # up to and including its stop token
        return tokenizer.detokenize(tf.concat([ids, new], 0))

    def generate(prompts, max_new_tokens, temperature, top_k, seed):
        checks = [_argument_check(tf.logical_and(max_new_tokens >= 0, max_new_tokens <= MAX_SERVED_NEW_TOKENS),
                                  f"`max_new_tokens` must be in [0, {MAX_SERVED_NEW_TOKENS}] (continue a longer text "
                                  "by calling generate again)", max_new_tokens),
                  _argument_check(tf.logical_and(tf.math.is_finite(temperature), temperature >= 0),
                                  "`temperature` must be a finite number >= 0 (0: greedy)", temperature),
                  _argument_check(top_k >= 0, "`top_k` must be >= 0 (0: every token)", top_k),
                  _argument_check(seed >= 0, "`seed` must be >= 0", seed)]
        with tf.control_dependencies(checks):  # every argument is used after the checks only
            prompts, max_new_tokens, temperature, top_k, seed = (
                tf.identity(x) for x in (prompts, max_new_tokens, temperature, top_k, seed))
        sampler = _ServedSampler(temperature, top_k)
        texts = tf.map_fn(lambda prompt: one(prompt, max_new_tokens, sampler, seed), prompts,
                          fn_output_signature=tf.string)
        return {"texts": texts}

    return generate, [tf.TensorSpec([None], tf.string, name="prompts"),
                      tf.TensorSpec([], tf.int32, name="max_new_tokens"),
                      tf.TensorSpec([], tf.float32, name="temperature"),
                      tf.TensorSpec([], tf.int32, name="top_k"),
                      tf.TensorSpec([], tf.int32, name="seed")]
