r"""Generation and scoring with a TransformerXLLM on any Keras backend: the prompt goes
through the memory segment by segment, then each new token costs one step against the
memory, held in an `InferenceCache` (`TransformerXLLM.call_with_cache`: no recomputation
of the context; with relative positions the memory is kept as its keys and values, and
the position keys are projected once per call). The token loop is one
`keras.ops.while_loop`, compiled per backend (a `tf.function` on TensorFlow, `jax.jit` on
JAX, eager on PyTorch) once per model and generation settings.

A batch of prompts of any lengths gives every row exactly what its prompt gives alone.
Transformer-XL's context depends on how the text was cut into segments, so the prompts'
contexts go through the memory one length at a time (prompts of one length are cut
alike); the caches then join, each row counting its own real memory slots, and the
token loop runs once for the whole batch. Samplers: `txl_keras.samplers`.

    python -m txl_keras.generate --model_dir=runs/quickstart --prompt="def main(" \
        --max_new_tokens=200 --temperature=0.8 --top_k=40 --seed=1
"""

import copy
import json
import logging
import time
import weakref

import keras
import numpy as np
from keras import ops

from txl_keras.layers import InferenceCache
from txl_keras.models import sizes
from txl_keras.samplers import BeamSampler, GreedySampler, RandomSampler, TopKSampler, TopPSampler, sampler_from

__all__ = ["generate", "score", "stream"]

BUILT_IN_SAMPLERS = (GreedySampler, RandomSampler, TopKSampler, TopPSampler, BeamSampler)
DECODE_CHUNK = 64  # steps per compiled call of a search, at most
_COMPILED = weakref.WeakKeyDictionary()  # model -> {generation or scoring settings: compiled steps}
_COMPILED_STATE = weakref.WeakKeyDictionary()  # model -> (its quantization, its LoRA rank) when they were traced
PROGRESS_AFTER_S = 2.0  # a search running longer logs its step after each piece
PIECE_S = 1.0  # a search sizes its pieces to about this long (at most DECODE_CHUNK steps)
logger = logging.getLogger(__name__)


def compile_for_backend(model, fn, any_shape=False):
    """`fn` (which calls `model` without changing its variables) compiled for the
    backend: tf.function, jax.jit over the model's variables, or eager under no_grad.
    `any_shape`: on TensorFlow, a shape that changes between calls is traced once more as
    unknown, then serves every call (JAX compiles each shape)."""
    backend = keras.config.backend()
    if backend == "tensorflow":
        import tensorflow as tf

        # Traced as written, as jax.jit traces it (no AutoGraph conversion of the model's code).
        return tf.function(fn, autograph=False, reduce_retracing=any_shape)
    if backend == "jax":
        import jax

        variables = model.trainable_variables + model.non_trainable_variables
        compiled = jax.jit(with_values(variables, fn))
        return lambda *args: compiled([v.value for v in variables], *args)
    import torch

    def no_grad(*args):
        with torch.no_grad():
            return fn(*args)

    return no_grad


def with_values(variables, fn):
    """`fn(*args)` as `run(values, *args)`, which reads `variables` as `values` (a function
    JAX compiles takes the weights as arguments)."""
    def run(values, *args):
        with keras.StatelessScope(state_mapping=list(zip(variables, values))):
            return fn(*args)

    return run


def _check_ids(ids, n_token, name="prompt"):
    ids = np.asarray(ids)
    if ids.ndim != 1 or len(ids) < 1:
        raise ValueError(f"Expected each `{name}` to hold at least one token id. Received shape {ids.shape}")
    if not np.issubdtype(ids.dtype, np.integer):
        raise ValueError(f"Expected integer token ids in `{name}`. Received dtype {ids.dtype}")
    if ids.min() < 0 or ids.max() >= n_token:
        raise ValueError(f"Prompt ids must be in [0, n_token={n_token}). Received ids in [{ids.min()}, {ids.max()}]")
    return ids.astype("int32")


def _check_prompt(prompt, n_token):
    prompt = np.asarray(prompt)
    if prompt.ndim != 2 or prompt.shape[1] < 1:
        raise ValueError(f"Expected `prompt` of shape (batch, length >= 1). Received shape {prompt.shape}")
    return np.stack([_check_ids(row, n_token) for row in prompt])


def _check_count(name, value, low, high=2**31 - 1):
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not low <= value <= high:
        raise ValueError(f"Expected `{name}` to be an integer in [{low}, {high}]. Received: {name}={value!r}")
    return int(value)


def _per_row(name, value, rows, low):
    """An int per row, from one int or a sequence of `rows` ints."""
    values = [value] * rows if isinstance(value, (int, np.integer)) and not isinstance(value, bool) else list(value)
    if len(values) != rows:
        raise ValueError(f"Expected `{name}` to be an integer or one per prompt ({rows}). Received {len(values)}")
    return np.asarray([_check_count(name, v, low) for v in values], "int32")


def _stops(stop_token, n_token):
    values = () if stop_token is None else (stop_token,) if isinstance(stop_token, (int, np.integer)) \
        else tuple(stop_token)
    return tuple(_check_count("stop_token", v, 0, n_token - 1) for v in values)


def generate(model, prompt, max_new_tokens, temperature=1.0, top_k=0, top_p=1.0, seed=0,
             stop_token=None, mem_len=None, clamp_len=None, same_length=None, sampler=None, check_memory=True):
    """Continue prompts by up to `max_new_tokens` tokens each.

    `prompt` is an int array `(batch, P)`, or a list of 1-D id sequences of any lengths.
    The next token is picked by `sampler` (a `txl_keras.samplers.Sampler`, beam search
    included), by default the one of `temperature` (0: greedy), `top_k` (0: off) and
    `top_p` (1: off). A draw is a pure function of the seed (the sampler's, else `seed`:
    an int, or one per row) and of how many tokens the row has generated, so a row gives
    the same text alone or in a batch. A row ends at the first of `stop_token` (an id or a
    tuple of ids), kept, and nothing follows it; `max_new_tokens` may be one int per row.
    `mem_len` (default: the config's) bounds the context the model sees. The search runs in
    compiled pieces of about `PIECE_S` seconds (at most `DECODE_CHUNK` steps), so Ctrl-C
    stops a long generation between two pieces; once it has run `PROGRESS_AFTER_S` seconds,
    each piece logs its step on this module's logger (INFO). `check_memory` refuses, with
    the figures, a call whose memory (the model's, and the new tokens') exceeds what this
    machine has available.

    Returns, for an array prompt, int32 numpy `(batch, P + max(max_new_tokens))`, each
    row padded with -1 after its last token (its stop token, or its own limit); for a
    list, a list of int32 arrays: each prompt and its new tokens, up to and including its
    stop token. Later calls with the same settings and sampler reuse the compiled steps.
    """
    config = model.config
    ragged = not _is_matrix(prompt)
    rows = [_check_ids(p, config.n_token) for p in prompt] if ragged else list(_check_prompt(prompt, config.n_token))
    if not rows:
        raise ValueError("Expected at least one prompt.")
    limits = _per_row("max_new_tokens", max_new_tokens, len(rows), 0)
    sampler = sampler or sampler_from(0 if temperature is None else temperature, top_k, top_p)
    seeds = _per_row("seed", sampler.seed if sampler.seed is not None else seed, len(rows), 0)
    stops = _stops(stop_token, config.n_token)
    settings = config.with_memory(mem_len, clamp_len, same_length)
    if check_memory:
        require_generation_memory(settings, len(rows), int(limits.max()), sampler)
    new = _search(model, settings, sampler, rows, limits, seeds, stops)
    if ragged:
        return [np.concatenate([ids, n]).astype("int32") for ids, n in zip(rows, new)]
    width = int(limits.max())
    return np.stack([np.concatenate([ids, n, np.full(width - len(n), -1)]) for ids, n in zip(rows, new)]).astype(
        "int32")


def require_generation_memory(settings, rows, new_tokens, sampler, bytes_per_token=0, override="check_memory=False"):
    """Refuse (`sizes.MemoryEstimateError`, one line with the figures) a generation whose
    memory exceeds what is available: the model's inference (`sizes.inference_bytes`, the
    beams included) and, per new token of every row, its ids twice (the pieces and the
    joined result; a beam's parents once more) and `bytes_per_token` more (the text a
    caller makes of them)."""
    beams = sampler.streams_per_prompt
    needed = sizes.inference_bytes(settings, rows * beams, scored_tokens=rows * beams, beam_search=beams > 1)
    needed += rows * new_tokens * ((3 if beams > 1 else 2) * 4 * beams + bytes_per_token)  # + beams' parents
    sizes.require_memory(needed, f"Generating {new_tokens:,} new tokens for {rows} prompt(s) at "
                                 f"mem_len={settings.mem_len}", override=override)


def _is_matrix(prompt):
    """An array (numpy or a backend's tensor) of prompts of one length; a list is ragged."""
    return not isinstance(prompt, (list, tuple)) and np.ndim(prompt) == 2


# A built-in sampler's numbers that enter its compiled steps as inputs: a new temperature or
# nucleus mass reuses the steps traced for another.
TRACED_FIELDS = ("temperature", "p")
# A built-in sampler's numbers its compiled steps never read (beam search ranks its final
# beams on the host): a new length penalty reuses the steps.
HOST_FIELDS = ("seed", "length_penalty")


def _sampler_key(sampler):
    """A built-in sampler is known by its config less `HOST_FIELDS` and `TRACED_FIELDS`
    (inputs); any other only as the same object."""
    if type(sampler) in BUILT_IN_SAMPLERS:
        static = {k: v for k, v in sampler.get_config().items() if k not in HOST_FIELDS + TRACED_FIELDS}
        return type(sampler).__name__, json.dumps(static, sort_keys=True)
    return sampler


def _sampler_inputs(sampler):
    """`{field: float32 tensor}` of a built-in sampler's `TRACED_FIELDS` (else empty)."""
    if type(sampler) not in BUILT_IN_SAMPLERS:
        return {}
    config = sampler.get_config()
    return {k: ops.convert_to_tensor(config[k], "float32") for k in TRACED_FIELDS if k in config}


def _with_inputs(sampler, inputs):
    """The sampler inside a compiled step: its traced fields the step's inputs."""
    if not inputs:
        return sampler
    traced = copy.copy(sampler)
    for name, value in inputs.items():
        setattr(traced, name, value)
    return traced


def _compiled(model, key, make):
    compiled = _COMPILED.setdefault(model, {})
    # A model quantized or given LoRA adapters since computes otherwise: its steps are traced again.
    state = (getattr(model, "quantization", None), getattr(model, "lora_rank", None))
    if _COMPILED_STATE.get(model, state) != state:
        compiled.clear()
    _COMPILED_STATE[model] = state
    if key not in compiled:
        compiled[key] = make()
    return compiled[key]


def prompt_cache(model, prompts, settings):
    """The cache after the prompts' context (all but the last token), ready for one-token
    steps. `prompts` int32 `(batch, L)`, one length."""
    feed = _compiled(model, ("feed", settings.to_json()), lambda: _compiled_feed(model, settings))
    context, segment = prompts[:, :-1], settings.tgt_len
    cache = model.init_cache(prompts.shape[0], settings.mem_len, settings.clamp_len)
    # JAX compiles each shape: fed a segment at a time, a whole segment's program serves every
    # prompt (a prompt's length compiles only its last segment); TensorFlow's one relaxed trace
    # takes the whole context.
    pieces = [context[:, s:s + segment] for s in range(0, context.shape[1], segment)] \
        if keras.config.backend() == "jax" else [context]
    for piece in pieces:
        cache = feed(ops.convert_to_tensor(piece), cache)
    return ready_for_steps(model, cache, settings)


def feed_context(model, context, cache, settings):
    """`cache` after `context` (int32 `(rows, L)`, L >= 0, known when traced or not) went
    through the memory in segments of `settings.tgt_len`, the last one shorter: the prompt
    feed of `generate`, `stream` and the SavedModel's `generate`, for a compiled function
    (one program for every full segment)."""
    memory, segment = step_memory(settings), settings.tgt_len
    ring_shape = ops.shape(cache.rings[0])  # every layer's ring has one layout, kept through the loop

    def advance(tokens, cache):
        cache = model.call_with_cache(tokens, cache, **memory)[1]
        return cache.map_rings(lambda ring: ops.reshape(ring, ring_shape))

    rows, length = ops.shape(context)
    full = length // segment

    def feed(s, cache):
        return advance(ops.slice(context, (0, s * segment), (rows, segment)), cache)

    if not isinstance(full, int) or full > 0:  # (a loop's body is traced even when it would not run)
        cache = ops.fori_loop(0, full, feed, cache)
    rest = ops.slice(context, (0, full * segment), (rows, length - full * segment))
    if isinstance(length, int):  # a length known when traced (always on JAX)
        return advance(rest, cache) if length % segment else cache
    return ops.cond(length % segment > 0, lambda: advance(rest, cache), lambda: cache)


def ready_for_steps(model, cache, settings):
    """A prompt's cache made ready for one-token steps: its written rows in the ring's first
    slots (`InferenceCache.turned`: a step reads only those until the ring fills) and the
    position keys of a one-token step (a longer projection would be sliced, a copy, per
    token)."""
    cache = cache.turned(cache.written)
    if cache.position_keys:
        cache = cache.with_position_keys(model.backbone.project_positions(settings.mem_len + 1, settings.clamp_len))
    return cache


def _compiled_feed(model, settings):
    compile_model, model = model, weakref.proxy(model)
    return compile_for_backend(compile_model, lambda context, cache: feed_context(model, context, cache, settings),
                               any_shape=True)


def _prompts_cache(model, rows, settings):
    """`(order, cache, last)` of prompts `rows` (1-D ids of any lengths): the contexts of
    each length go through the memory together, then their caches join in `order` (the
    rows by length), each row counting its own real memory slots; `last` int32 `(rows,)`
    the last token of each, in that order."""
    order, caches = [], []
    for length in sorted({len(ids) for ids in rows}):
        group = [r for r, ids in enumerate(rows) if len(ids) == length]
        order += group
        caches.append(prompt_cache(model, np.stack([rows[r] for r in group]), settings))
    # one offset for all: the longest prompts' (the most rows written)
    cache = InferenceCache.joined([c.per_row(caches[-1].offset) for c in caches])
    return order, cache, ops.convert_to_tensor(np.asarray([rows[r][-1] for r in order], "int32"))


def _search(model, settings, sampler, rows, limits, seeds, stops):
    """The new tokens of each prompt of `rows` (1-D ids of any lengths), up to its stop
    token or `limits[r]`: a list of int32 arrays. The sampler's search runs on every
    prompt at once, in compiled pieces sized to about `PIECE_S` seconds (the first one
    step)."""
    steps = int(limits.max())
    if steps == 0:
        return [np.zeros((0,), "int32") for _ in rows]
    search = _compiled_search(model, settings, sampler, stops)
    order, cache, last = _prompts_cache(model, rows, settings)
    state = sampler.begin(last, cache, ops.convert_to_tensor(limits[order]), ops.convert_to_tensor(seeds[order]))
    inputs = _sampler_inputs(sampler)
    tokens, parents = [], []
    started, piece = time.monotonic(), 1
    while True:
        piece_started = time.monotonic()
        state, new, new_parents, taken = search(state, ops.convert_to_tensor(piece, "int32"), inputs)
        taken = int(ops.convert_to_numpy(taken))
        tokens.append(ops.convert_to_numpy(new)[:, :taken])
        if new_parents is not None:
            parents.append(ops.convert_to_numpy(new_parents)[:, :taken])
        step = int(ops.convert_to_numpy(state.step))
        if step >= steps or bool(ops.convert_to_numpy(ops.all(state.done))):
            break
        piece = int(np.clip(PIECE_S / max((time.monotonic() - piece_started) / max(taken, 1), 1e-9), 1,
                            DECODE_CHUNK))
        if time.monotonic() - started >= PROGRESS_AFTER_S:
            logger.info("%s: step %d of at most %d (%.0f s)", sampler.progress_name, step, steps,
                        time.monotonic() - started)
    lengths = ops.convert_to_numpy(state.lengths)
    best = sampler.best_streams(ops.convert_to_numpy(state.scores), lengths)
    paths = _paths(np.concatenate(tokens, axis=1), np.concatenate(parents, axis=1) if parents else None, best)
    new = [None] * len(rows)
    for r, stream, path in zip(order, best, paths):
        new[r] = path[: lengths[stream]].astype("int32")
    return new


def _paths(tokens, parents, streams):
    """The tokens of each of `streams` from the first step: its own row of `tokens`
    (streams, T), or, with `parents`, the row of the stream it continued at each step."""
    if parents is None:
        return tokens[streams]
    paths = np.empty((len(streams), tokens.shape[1]), tokens.dtype)
    at = np.asarray(streams)
    for t in range(tokens.shape[1] - 1, -1, -1):
        paths[:, t] = tokens[at, t]
        at = parents[at, t]
    return paths


def step_memory(settings):
    """The memory settings of `call_with_cache`, from a config with the call's settings."""
    return dict(mem_len=settings.mem_len, clamp_len=settings.clamp_len, same_length=settings.same_length)


def model_step(model, settings):
    """The model's step of a search: `next(last, cache, in_place)` -> `(log-probabilities
    (streams, n_token), the cache)` after tokens `last` int32 `(streams,)`; `in_place` as
    in `call_with_cache`."""
    memory = step_memory(settings)

    def next(last, cache, in_place):
        out, cache = model.call_with_cache(last[:, None], cache, return_log_probs=True, in_place=in_place, **memory)
        return out["log_probs"][:, 0], cache

    return next


def _compiled_search(model, settings, sampler, stops):
    """`search(state, steps, sampler_inputs)` -> the sampler's `search` of up to `steps`
    steps (at most `DECODE_CHUNK`), compiled once per model, settings, sampler and stops."""

    def make():
        compile_model, weak = model, weakref.proxy(model)
        next, stop_ids = model_step(weak, settings), ops.convert_to_tensor(list(stops) or [-1], "int32")

        def search(state, steps, sampler_inputs):
            return _with_inputs(sampler, sampler_inputs).search(next, state, steps, stop_ids, DECODE_CHUNK)

        return compile_for_backend(compile_model, search)

    return _compiled(model, ("decode", settings.to_json(), _sampler_key(sampler), DECODE_CHUNK, stops), make)


def stream(model, prompt, max_new_tokens, sampler, stops=(), settings=None, seed=0):
    """Yield the new tokens of one prompt (1-D ids) one at a time, each exactly the token
    `generate` gives at that place for the same sampler and seed (one step of the same
    compiled search at a time)."""
    if not sampler.streams_tokens:
        raise ValueError(f"{type(sampler).__name__} chooses its tokens at the end; stream with a token-by-token "
                         "sampler (greedy, random, top_k, top_p).")
    settings = settings or model.config.with_memory()
    prompt = _check_ids(prompt, model.config.n_token)
    max_new_tokens = _check_count("max_new_tokens", max_new_tokens, 0)
    seeds = _per_row("seed", sampler.seed if sampler.seed is not None else seed, 1, 0)
    stops = _stops(stops, model.config.n_token)
    if max_new_tokens == 0:
        return
    search = _compiled_search(model, settings, sampler, stops)
    _, cache, last = _prompts_cache(model, [prompt], settings)
    state = sampler.begin(last, cache, ops.convert_to_tensor([max_new_tokens], "int32"), ops.convert_to_tensor(seeds))
    inputs, one = _sampler_inputs(sampler), ops.convert_to_tensor(1, "int32")
    for _ in range(max_new_tokens):
        state, tokens, _, _ = search(state, one, inputs)
        token = int(ops.convert_to_numpy(tokens)[0, 0])
        yield token
        if token in stops:
            return


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
    step = _compiled(model, ("score", settings.to_json()), lambda: _compiled_scorer(model, settings))
    cache = model.init_cache(ids.shape[0], settings.mem_len, settings.clamp_len, segment_length=length)
    nll = []
    for start in range(0, ids.shape[1] - 1, length):
        end = min(start + length, ids.shape[1] - 1)
        out, cache = step(ops.convert_to_tensor(ids[:, start:end]), ops.convert_to_tensor(ids[:, start + 1:end + 1]),
                          cache)
        nll.append(ops.convert_to_numpy(out))
    return np.concatenate(nll, axis=1).astype("float32")


def scored_segment(model, settings):
    """`segment(tokens, targets, cache) -> (nll, cache)`: the NLL of each target, float32
    `(batch, T)`, read through the memory in `cache` (an `InferenceCache` made at the memory
    settings of `settings`), a target < 0 (padding) scored 0; the cache advanced by the
    segment. `score` and the JAX trainer's evaluation read streams with it."""
    memory = step_memory(settings)

    def segment(tokens, targets, cache):
        out, cache = model.call_with_cache(tokens, cache, targets=ops.maximum(targets, 0), **memory)
        return ops.where(targets >= 0, ops.cast(out["nll"], "float32"), 0.0), cache

    return segment


def _compiled_scorer(model, settings):
    """`scored_segment` compiled for the backend."""
    compile_model, model = model, weakref.proxy(model)
    return compile_for_backend(compile_model, scored_segment(model, settings))
