"""SavedModel export with the memory carried explicitly in flat, named signatures.

    python -m txl_keras.export --model_dir=runs/quickstart --output=exported/quickstart

Signatures (every memory is `(batch, mem_len, d_model)`; `memory_valid` counts the real
slots, the rest are masked):
- `initial_memory(batch_size)` -> `mem_0 ... mem_{L-1}`, `memory_valid`
- `next_log_probs(tokens, memory_valid, mem_0 ...)` -> `log_probs` (of the last
  position, `(batch, n_token)`), `new_mem_0 ...`, `new_memory_valid`
- `score(tokens, targets, memory_valid, mem_0 ...)` -> `nll` `(batch, time)`,
  `new_mem_0 ...`, `new_memory_valid`
The result loads with `tf.saved_model.load` in a process without txl_keras. The output
may be any `tf.io.gfile` path (local, gs://, ...).
"""

import json

import keras
import tensorflow as tf

from tf_records import files

EXPORT_INFO = "txl_config.json"


def _memory_specs(config, mem_len):
    return [tf.TensorSpec([None, mem_len, config.d_model], tf.float32, name=f"mem_{i}")
            for i in range(config.n_layer)]


def export_saved_model(model, path, mem_len=None, clamp_len=None, same_length=None):
    """Write `model` (a TransformerXLLM) as a SavedModel with explicit memory.

    `mem_len`, `clamp_len`, `same_length` default to the model's config (pass the
    evaluation settings to serve with a longer memory).
    """
    serving = model.config.with_memory(mem_len, clamp_len, same_length)
    signatures = _signatures(model, serving)
    archive = keras.export.ExportArchive()
    archive.track(model)
    for name, (function, spec) in signatures.items():
        archive.add_endpoint(name, tf.function(function), input_signature=spec)
    with files.reporting(path):
        archive.write_out(path, verbose=False)
    files.atomic_write(files.join(path, EXPORT_INFO),
                       json.dumps({"config": model.config.to_dict(), "mem_len": serving.mem_len}, indent=2))
    return path


def _signatures(model, serving):
    """`{name: (function, input_signature)}` of the three endpoints."""
    mem_len = serving.mem_len
    overrides = dict(mem_len=mem_len, clamp_len=serving.clamp_len, same_length=serving.same_length)
    mem_specs = _memory_specs(serving, mem_len)
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
        zeros = tf.zeros([batch_size, mem_len, serving.d_model], tf.float32)
        result = {f"mem_{i}": zeros for i in range(serving.n_layer)}
        result["memory_valid"] = tf.constant(mem_len if serving.mem_init == "zeros" else 0, tf.int32)
        return result

    def next_log_probs(tokens, memory_valid, *mems):
        out, result = run(tokens, None, memory_valid, mems)
        result["log_probs"] = model.softmax.log_probs(out["hidden"][:, -1:])[:, 0]
        return result

    def score(tokens, targets, memory_valid, *mems):
        out, result = run(tokens, targets, memory_valid, mems)
        result["nll"] = out["nll"]
        return result

    return {
        "initial_memory": (initial_memory, [tf.TensorSpec([], tf.int32, name="batch_size")]),
        "next_log_probs": (next_log_probs, [tokens_spec, valid_spec] + mem_specs),
        "score": (score, [tokens_spec, targets_spec, valid_spec] + mem_specs),
    }
