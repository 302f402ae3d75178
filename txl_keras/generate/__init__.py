"""Sampling from a TransformerXLLM on any Keras backend: the prompt goes through the
memory segment by segment, then each new token costs one step against the memory, held
in an `InferenceCache` (`TransformerXLLM.call_with_cache`: no recomputation of the context;
with relative positions the memory is kept as its keys and values, and the position keys
are projected once per call). The token loop is one `keras.ops.while_loop`, compiled per
backend (a `tf.function` on TensorFlow, `jax.jit` on JAX, eager on PyTorch) once per model
and generation settings.

    python -m txl_keras.generate --model_dir=runs/quickstart --prompt="def main(" \
        --max_new_tokens=200 --temperature=0.8 --top_k=40 --seed=1
"""

import json
import weakref

import keras
import numpy as np
from keras import ops

from txl_keras.generate.samplers import (GreedySampler, Sampler, TemperatureSampler, TopKSampler,
                                         TopPSampler, sampler_from)

__all__ = ["GreedySampler", "Sampler", "TemperatureSampler", "TopKSampler", "TopPSampler", "generate",
           "sampler_from", "score"]

BUILT_IN_SAMPLERS = (GreedySampler, TemperatureSampler, TopKSampler, TopPSampler)
_COMPILED = weakref.WeakKeyDictionary()  # model -> {generation or scoring settings: compiled steps}


def compile_for_backend(model, fn):
    """`fn` (which calls `model` without changing its variables) compiled for the
    backend: tf.function, jax.jit over the model's variables, or eager under no_grad."""
    backend = keras.config.backend()
    if backend == "tensorflow":
        import tensorflow as tf

        return tf.function(fn)
    if backend == "jax":
        import jax

        variables = model.trainable_variables + model.non_trainable_variables

        @jax.jit
        def stateless(values, *args):
            with keras.StatelessScope(state_mapping=list(zip(variables, values))):
                return fn(*args)

        return lambda *args: stateless([v.value for v in variables], *args)
    import torch

    def no_grad(*args):
        with torch.no_grad():
            return fn(*args)

    return no_grad


def _check_prompt(prompt, n_token):
    prompt = np.asarray(prompt)
    if prompt.ndim != 2 or prompt.shape[1] < 1:
        raise ValueError(f"Expected `prompt` of shape (batch, length >= 1). Received shape {prompt.shape}")
    if not np.issubdtype(prompt.dtype, np.integer):
        raise ValueError(f"Expected integer token ids in `prompt`. Received dtype {prompt.dtype}")
    if prompt.min() < 0 or prompt.max() >= n_token:
        raise ValueError(f"Prompt ids must be in [0, n_token={n_token}). Received ids in "
                         f"[{prompt.min()}, {prompt.max()}]")
    return prompt.astype("int32")


def _check_count(name, value, low, high=2**31 - 1):
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not low <= value <= high:
        raise ValueError(f"Expected `{name}` to be an integer in [{low}, {high}]. Received: {name}={value!r}")
    return int(value)


def generate(model, prompt, max_new_tokens, temperature=1.0, top_k=0, top_p=1.0, seed=0,
             stop_token=None, mem_len=None, clamp_len=None, same_length=None, sampler=None):
    """Continue `prompt` (int `(batch, P)`, P >= 1) by `max_new_tokens` tokens.

    The next token is picked by `sampler` (a `Sampler`), by default the one of
    `temperature` (0: greedy), `top_k` (0: off) and `top_p` (1: off), see
    `sampler_from`. Sampling is reproducible for a given `seed`. After a row emits
    `stop_token` it only repeats it, and the loop ends once every row has stopped.
    `mem_len` (default: the config's) bounds the context the model sees. Returns int32
    numpy `(batch, P + max_new_tokens)`. Later calls with the same settings and sampler
    reuse the compiled steps.
    """
    config = model.config
    prompt = _check_prompt(prompt, config.n_token)
    max_new_tokens = _check_count("max_new_tokens", max_new_tokens, 0)
    seed = _check_count("seed", seed, 0)
    stop = -1 if stop_token is None else _check_count("stop_token", stop_token, 0, config.n_token - 1)
    sampler = sampler or sampler_from(0 if temperature is None else temperature, top_k, top_p)
    settings = config.with_memory(mem_len, clamp_len, same_length)
    # A built-in sampler is known by its config; any other only as the same object.
    sampler_key = (type(sampler).__name__, json.dumps(sampler.get_config(), sort_keys=True)) \
        if type(sampler) in BUILT_IN_SAMPLERS else sampler
    compiled = _COMPILED.setdefault(model, {})
    key = (settings.to_json(), sampler_key, max_new_tokens, stop)
    if key not in compiled:
        compiled[key] = _compiled_steps(model, settings, sampler, max_new_tokens, stop)
    feed, decode = compiled[key]

    context = prompt[:, :-1]
    cache = model.init_cache(prompt.shape[0], settings.mem_len, settings.clamp_len,
                             segment_length=min(config.tgt_len, max(context.shape[1], 1)))
    for start in range(0, context.shape[1], config.tgt_len):
        cache = feed(ops.convert_to_tensor(context[:, start:start + config.tgt_len]), cache)
    if cache.position_keys:  # exactly the keys of a one-token step (a longer projection is sliced, a copy, per token)
        cache = cache._replace(position_keys=tuple(model.backbone.project_positions(settings.mem_len + 1,
                                                                                    settings.clamp_len)))
    new = decode(ops.convert_to_tensor(prompt[:, -1]), cache, ops.convert_to_tensor(seed, "int32"))
    return np.concatenate([prompt, ops.convert_to_numpy(new).astype("int32")], axis=1)


def _compiled_steps(model, settings, sampler, max_new_tokens, stop):
    """`(feed, decode)`: `feed(tokens, cache)` advances the cache over a prompt segment;
    `decode(last, cache, seed)` produces the new tokens, int32 `(batch, max_new_tokens)`.
    They hold the model weakly, so that the cache of compiled steps does not keep it alive."""
    compile_model, model = model, weakref.proxy(model)
    memory = dict(mem_len=settings.mem_len, clamp_len=settings.clamp_len, same_length=settings.same_length)

    def feed(tokens, cache):
        return model.call_with_cache(tokens, cache, **memory)[1]

    def decode(last, cache, seed):
        def cond(i, last, done, produced, cache):
            return ops.logical_and(i < max_new_tokens, ops.logical_not(ops.all(done)))

        def body(i, last, done, produced, cache):
            out, cache = model.call_with_cache(last[:, None], cache, return_log_probs=True, **memory)
            token = sampler(out["log_probs"][:, 0], ops.stack([seed, i]))
            token = ops.where(done, stop, ops.cast(token, "int32"))
            produced = ops.slice_update(produced, (0, i), token[:, None])
            return i + 1, token, ops.logical_or(done, ops.equal(token, stop)), produced, cache

        batch = ops.shape(last)[0]
        start = (ops.convert_to_tensor(0, "int32"), last, ops.zeros((batch,), "bool"),
                 ops.full((batch, max_new_tokens), stop, "int32"), cache)
        return ops.while_loop(cond, body, start)[3]

    return compile_for_backend(compile_model, feed), compile_for_backend(compile_model, decode)


def score(model, ids, mem_len=None, clamp_len=None, same_length=None, segment_length=None):
    """The NLL (nats) of each token of `ids` (int `(batch, L)`, L >= 2) but the first,
    given the tokens before it: float32 numpy `(batch, L - 1)`. The text goes through the
    memory in segments of `segment_length` (default the config's `tgt_len`) with the
    memory settings (default the config's), as evaluation scores a stream."""
    config = model.config
    ids = _check_prompt(ids, config.n_token)
    if ids.shape[1] < 2:
        raise ValueError(f"Expected at least 2 tokens to score (the first is only context). Received {ids.shape[1]}")
    length = _check_count("segment_length", segment_length or config.tgt_len, 1)
    settings = config.with_memory(mem_len, clamp_len, same_length)
    compiled = _COMPILED.setdefault(model, {})
    key = ("score", settings.to_json())
    if key not in compiled:
        compiled[key] = _compiled_scorer(model, settings)
    step = compiled[key]
    cache = model.init_cache(ids.shape[0], settings.mem_len, settings.clamp_len, segment_length=length)
    nll = []
    for start in range(0, ids.shape[1] - 1, length):
        end = min(start + length, ids.shape[1] - 1)
        out, cache = step(ops.convert_to_tensor(ids[:, start:end]), ops.convert_to_tensor(ids[:, start + 1:end + 1]),
                          cache)
        nll.append(ops.convert_to_numpy(out))
    return np.concatenate(nll, axis=1).astype("float32")


def _compiled_scorer(model, settings):
    """`step(tokens, targets, cache) -> (nll, cache)`, compiled for the backend."""
    compile_model, model = model, weakref.proxy(model)
    memory = dict(mem_len=settings.mem_len, clamp_len=settings.clamp_len, same_length=settings.same_length)

    def step(tokens, targets, cache):
        out, cache = model.call_with_cache(tokens, cache, targets=targets, **memory)
        return out["nll"], cache

    return compile_for_backend(compile_model, step)
