"""SavedModel export with the memory carried explicitly in flat, named signatures.

    python -m txl_keras.export --model_dir=runs/quickstart --output=exported/quickstart

Signatures (`B` streams, `T` tokens; every memory is `(B, mem_len, d_model)` float32 and
`memory_valid` counts its real slots, the newest; the rest are masked):
- `initial_memory(batch_size)` -> `mem_0 ... mem_{L-1}`, `memory_valid`: an empty memory.
- `next_log_probs(tokens (B, T) int32, memory_valid, mem_0 ...)` -> `log_probs` `(B, n_token)`
  float32, the next token's log-probabilities after the last position only, and
  `new_mem_0 ...`, `new_memory_valid`: the memory after the segment.
- `score(tokens (B, T), targets (B, T), memory_valid, mem_0 ...)` -> `nll` `(B, T)` float32
  (nats), `new_mem_0 ...`, `new_memory_valid`.
- With a vocabulary: `encode(text)` -> `ids` `(N,)` int32 (`TransformerXLTokenizer.tokenize_prompt`:
  an unfinished last line gets no closing `<eos>`), `decode(ids (N,))` -> `text`
  (`TransformerXLTokenizer.detokenize`: at word level each `<eos>` a line break), and `vocabulary()` -> `symbols` `(n_token,)` string and
  `settings`, a JSON string of its tokenisation rules; it is also the file
  `assets/vocab.json` (`tf_records.vocabulary.Vocabulary`'s format).
Token ids outside `[0, n_token)` and `memory_valid` outside `[0, mem_len]` are refused (an
`InvalidArgumentError` naming the argument). The attribute functions take the same
argument names as the signatures. The result loads with `tf.saved_model.load` in a process
without txl_keras. The output may be any `tf.io.gfile` path (local, gs://, ...).
"""

import json

import keras
import tensorflow as tf

from tf_records import files
from txl_keras.tokenizers import TransformerXLTokenizer

EXPORT_INFO = "txl_config.json"
VOCAB_ASSET = "vocab.json"


def export_saved_model(model, path, vocabulary=None, mem_len=None, clamp_len=None, same_length=None):
    """Write `model` (a TransformerXLLM) as a SavedModel with explicit memory, and with
    `vocabulary` (a `tf_records.vocabulary.Vocabulary` of `n_token` symbols) its text
    signatures. `mem_len`, `clamp_len`, `same_length` default to the model's config (pass
    the evaluation settings to serve with a longer memory). The folder is written whole
    (`files.staged_folder`): a second export to `path` is refused, an interrupted one is
    finished by the same call."""
    serving = model.config.with_memory(mem_len, clamp_len, same_length)
    if vocabulary is not None and len(vocabulary) != serving.n_token:
        raise ValueError(f"The vocabulary has {len(vocabulary)} symbols but the model has n_token="
                         f"{serving.n_token}; export it with the vocabulary its records were built with "
                         "(--vocab).")
    archive = keras.export.ExportArchive()
    archive.track(model)
    for name, (function, spec) in _signatures(model, serving).items():
        archive.add_endpoint(name, tf.function(function), input_signature=spec)
    if vocabulary is not None:
        for name, (function, spec) in _text_signatures(archive, vocabulary).items():
            archive.add_endpoint(name, tf.function(function), input_signature=spec)
    with files.staged_folder(path, "an export", last="saved_model.pb") as staging:
        with files.reporting(path):
            archive.write_out(staging, verbose=False)
        if vocabulary is not None:
            vocabulary.save(files.join(staging, "assets", VOCAB_ASSET))
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
    """`{name: (function, input_signature)}` of the memory endpoints."""
    mem_len, n_token = serving.mem_len, serving.n_token
    overrides = dict(mem_len=mem_len, clamp_len=serving.clamp_len, same_length=serving.same_length)
    mem_specs = [tf.TensorSpec([None, mem_len, serving.d_model], tf.float32, name=f"mem_{i}")
                 for i in range(serving.n_layer)]
    valid_spec = tf.TensorSpec([], tf.int32, name="memory_valid")
    tokens_spec = tf.TensorSpec([None, None], tf.int32, name="tokens")
    targets_spec = tf.TensorSpec([None, None], tf.int32, name="targets")

    def run(tokens, targets, memory_valid, mems):
        message = f"`memory_valid` must be in [0, mem_len={mem_len}]"
        with tf.control_dependencies([tf.debugging.assert_non_negative(memory_valid, message=message),
                                      tf.debugging.assert_less_equal(memory_valid, mem_len, message=message)]):
            memory_valid = tf.identity(memory_valid)
        mems = [tf.cast(m, model.compute_dtype) for m in mems]
        out = model(_checked(tokens, "tokens", n_token), training=False, mems=mems, memory_valid=memory_valid,
                    targets=None if targets is None else _checked(targets, "targets", n_token), **overrides)
        result = {f"new_mem_{i}": tf.cast(m, tf.float32) for i, m in enumerate(out["mems"])}
        result["new_memory_valid"] = tf.cast(out["memory_valid"], tf.int32)
        return out, result

    def initial_memory(batch_size):
        zeros = tf.zeros([batch_size, mem_len, serving.d_model], tf.float32)
        result = {f"mem_{i}": zeros for i in range(serving.n_layer)}
        result["memory_valid"] = tf.constant(mem_len if serving.mem_init == "zeros" else 0, tf.int32)
        return result

    def next_log_probs(tokens, memory_valid, *mem):  # (*mem: the arguments are named mem_0, mem_1, ...)
        out, result = run(tokens, None, memory_valid, mem)
        result["log_probs"] = model.softmax.log_probs(out["hidden"][:, -1:])[:, 0]
        return result

    def score(tokens, targets, memory_valid, *mem):
        out, result = run(tokens, targets, memory_valid, mem)
        result["nll"] = out["nll"]
        return result

    return {
        "initial_memory": (initial_memory, [tf.TensorSpec([], tf.int32, name="batch_size")]),
        "next_log_probs": (next_log_probs, [tokens_spec, valid_spec] + mem_specs),
        "score": (score, [tokens_spec, targets_spec, valid_spec] + mem_specs),
    }


def _text_signatures(archive, vocabulary):
    """`encode`, `decode` and `vocabulary` endpoints: the `TransformerXLTokenizer`'s own
    functions (`tokenize_prompt`, `detokenize`), traced into the SavedModel."""
    settings = {k: v for k, v in vocabulary.to_dict().items() if k != "symbols"}
    tokenizer = TransformerXLTokenizer(vocabulary)
    archive.track(tokenizer._table)

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
