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
from txl_keras.samplers import (BeamSampler, GreedySampler, RandomSampler, Sampler, TopKSampler, TopPSampler,
                                sampler_from)

__all__ = ["beam_search", "generate", "score", "stream"]

BUILT_IN_SAMPLERS = (GreedySampler, RandomSampler, TopKSampler, TopPSampler)
DECODE_CHUNK = 64  # new tokens per compiled call of the token loop
_COMPILED = weakref.WeakKeyDictionary()  # model -> {generation or scoring settings: compiled steps}
_COMPILED_STATE = weakref.WeakKeyDictionary()  # model -> (its quantization, its LoRA rank) when they were traced
PROGRESS_AFTER_S = 2.0  # a beam search running longer logs its step after each piece
PIECE_S = 1.0  # a beam search sizes its pieces to about this long (at most DECODE_CHUNK steps)
logger = logging.getLogger(__name__)


def compile_for_backend(model, fn):
    """`fn` (which calls `model` without changing its variables) compiled for the
    backend: tf.function, jax.jit over the model's variables, or eager under no_grad."""
    backend = keras.config.backend()
    if backend == "tensorflow":
        import tensorflow as tf

        # Traced as written, as jax.jit traces it (no AutoGraph conversion of the model's code).
        return tf.function(fn, autograph=False)
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
    `mem_len` (default: the config's) bounds the context the model sees. The token loop
    runs in compiled pieces of `DECODE_CHUNK` steps, so Ctrl-C stops a long generation
    between two pieces. `check_memory` refuses, with the figures, a call whose memory
    (the model's, and the new tokens') exceeds what this machine has available.

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
    new = [None] * len(rows)
    if isinstance(sampler, BeamSampler):
        for r, ids in enumerate(rows):
            new[r] = beam_search(model, ids, int(limits[r]), sampler, stops, settings)
    else:
        out = _generate_rows(model, settings, sampler, rows, limits, seeds, stops)
        new = [_until_stop(tokens[: limits[r]], stops) for r, tokens in enumerate(out)]
    if ragged:
        return [np.concatenate([ids, n]).astype("int32") for ids, n in zip(rows, new)]
    width = int(limits.max())
    return np.stack([np.concatenate([ids, n, np.full(width - len(n), -1)]) for ids, n in zip(rows, new)]).astype(
        "int32")


def require_generation_memory(settings, rows, new_tokens, sampler, bytes_per_token=0, override="check_memory=False"):
    """Refuse (`sizes.MemoryEstimateError`, one line with the figures) a generation whose
    memory exceeds what is available: the model's inference (`sizes.inference_bytes`, the
    beams included) and, per new token of every row, its ids twice (the pieces and the
    joined result) and `bytes_per_token` more (the text a caller makes of them)."""
    beams = sampler.num_beams if isinstance(sampler, BeamSampler) else 1
    needed = sizes.inference_bytes(settings, rows * beams, scored_tokens=rows * beams, beam_search=beams > 1)
    needed += rows * new_tokens * (2 * 4 * beams + bytes_per_token)
    sizes.require_memory(needed, f"Generating {new_tokens:,} new tokens for {rows} prompt(s) at "
                                 f"mem_len={settings.mem_len}", override=override)


def _is_matrix(prompt):
    """An array (numpy or a backend's tensor) of prompts of one length; a list is ragged."""
    return not isinstance(prompt, (list, tuple)) and np.ndim(prompt) == 2


def _until_stop(tokens, stops):
    for k, token in enumerate(tokens):
        if int(token) in stops:
            return np.asarray(tokens[: k + 1], "int32")
    return np.asarray(tokens, "int32")


# A built-in sampler's numbers that enter its compiled steps as inputs: a new temperature or
# nucleus mass reuses the steps traced for another.
TRACED_FIELDS = ("temperature", "p")


def _sampler_key(sampler):
    """A built-in sampler is known by its config less its seed and `TRACED_FIELDS` (inputs);
    any other only as the same object."""
    if type(sampler) in BUILT_IN_SAMPLERS:
        static = {k: v for k, v in sampler.get_config().items() if k != "seed" and k not in TRACED_FIELDS}
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
    """The cache after the prompts' context (all but the last token, in segments of
    `tgt_len`), ready for one-token steps. `prompts` int32 `(batch, L)`, one length."""
    feed = _compiled(model, ("feed", settings.to_json()), lambda: _compiled_feed(model, settings))
    context, tgt_len = prompts[:, :-1], model.config.tgt_len
    cache = model.init_cache(prompts.shape[0], settings.mem_len, settings.clamp_len,
                             segment_length=min(tgt_len, max(context.shape[1], 1)))
    for start in range(0, context.shape[1], tgt_len):
        cache = feed(ops.convert_to_tensor(context[:, start:start + tgt_len]), cache)
    return ready_for_steps(model, cache, settings)


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
    memory = step_memory(settings)

    def feed(tokens, cache):
        return model.call_with_cache(tokens, cache, **memory)[1]

    return compile_for_backend(compile_model, feed)


def _generate_rows(model, settings, sampler, rows, limits, seeds, stops):
    """New tokens int32 `(batch, max(limits))` of prompts `rows` (1-D ids of any lengths;
    a stopped or finished row repeats its last token): the contexts of each length go
    through the memory together, then every row takes its steps in one batch, in compiled
    pieces of `DECODE_CHUNK` steps (a Python signal, Ctrl-C, is handled between two)."""
    steps = int(limits.max())
    if steps == 0:
        return np.zeros((len(rows), 0), "int32")
    key = ("decode", settings.to_json(), _sampler_key(sampler), DECODE_CHUNK, stops)
    decode = _compiled(model, key, lambda: _compiled_decode(model, settings, sampler, DECODE_CHUNK, stops))
    order, caches = [], []
    for length in sorted({len(ids) for ids in rows}):
        group = [r for r, ids in enumerate(rows) if len(ids) == length]
        order += group
        caches.append(prompt_cache(model, np.stack([rows[r] for r in group]), settings))
    # one offset for all: the longest prompts' (the most rows written)
    caches = [c.per_row(caches[-1].offset) for c in caches]
    cache = InferenceCache.joined(caches)
    last = ops.convert_to_tensor(np.asarray([rows[r][-1] for r in order], "int32"))
    limits, seeds = ops.convert_to_tensor(limits[order]), ops.convert_to_tensor(seeds[order])
    done, inputs = limits <= 0, _sampler_inputs(sampler)
    pieces = []
    for start in range(0, steps, DECODE_CHUNK):
        new, last, done, cache = decode(last, done, cache, limits, seeds, ops.convert_to_tensor(start, "int32"), inputs)
        pieces.append(ops.convert_to_numpy(new))
        if bool(ops.convert_to_numpy(ops.all(done))):
            break
    new = np.concatenate(pieces, axis=1)[:, :steps]
    out = np.empty((len(rows), steps), "int32")
    out[order, : new.shape[1]] = new
    out[order, new.shape[1]:] = new[:, -1:]
    return out


def step_memory(settings):
    """The memory settings of `call_with_cache`, from a config with the call's settings."""
    return dict(mem_len=settings.mem_len, clamp_len=settings.clamp_len, same_length=settings.same_length)


def next_token(model, settings, sampler, last, cache, seeds, step, in_place=False):
    """One step of every row: `(the next tokens int32 (B,), the cache)` after `last` (B,),
    drawn with the keys `(seeds[r], step)`; `in_place` as in `call_with_cache`."""
    out, cache = model.call_with_cache(last[:, None], cache, return_log_probs=True, in_place=in_place,
                                       **step_memory(settings))
    keys = ops.stack([seeds, ops.full(ops.shape(seeds), step, "int32")], axis=1)
    return ops.cast(sampler(out["log_probs"][:, 0], keys), "int32"), cache


def decode_loop(model, settings, sampler, steps, stops, last, cache, limits, seeds, done=None, start=0):
    """The token loop: up to `steps` one-token steps from the last tokens `last` (B,)
    against `cache`, the `start`-th to the `start + steps`-th new token of each row; row r
    stops at one of `stops` or after `limits[r]` tokens (`done` (B,) bool: rows already
    ended); its draws are keyed `(seeds[r], its token count)`; the loop writes a copy of
    the cache's rings in place (`InferenceCache.owned`). Returns `(new tokens int32
    (B, steps): a row that has ended repeats its last token, the last tokens (B,), done
    (B,), the cache)`."""
    stop_ids = ops.convert_to_tensor(list(stops) or [-1], "int32")

    def cond(i, last, done, produced, cache):
        return ops.logical_and(i < steps, ops.logical_not(ops.all(done)))

    def body(i, last, done, produced, cache):
        token, cache = next_token(model, settings, sampler, last, cache, seeds, start + i, in_place=True)
        token = ops.where(done, last, token)
        produced = ops.slice_update(produced, (0, i), token[:, None])
        stopped = ops.any(ops.equal(token[:, None], stop_ids[None]), axis=1)
        done = ops.logical_or(done, ops.logical_or(stopped, start + i + 1 >= limits))
        return i + 1, token, done, produced, cache

    batch = ops.shape(last)[0]
    done = limits <= 0 if done is None else done
    i, last, done, produced, cache = ops.while_loop(
        cond, body, (ops.convert_to_tensor(0, "int32"), last, done, ops.zeros((batch, steps), "int32"), cache.owned()))
    # the steps not taken (every row ended) repeat each row's last token
    produced = ops.where(ops.arange(steps)[None] < i, produced, last[:, None])
    return produced, last, done, cache


def _compiled_decode(model, settings, sampler, steps, stops):
    compile_model, model = model, weakref.proxy(model)

    def decode(last, done, cache, limits, seeds, start, sampler_inputs):
        return decode_loop(model, settings, _with_inputs(sampler, sampler_inputs), steps, stops, last, cache, limits,
                           seeds, done, start)

    return compile_for_backend(compile_model, decode)


def beam_search(model, prompt, max_new_tokens, sampler, stops=(), settings=None):
    """The new tokens of the best beam (int32 `(n,)`, up to its stop token) of `prompt`
    (1-D ids), with `sampler` a `BeamSampler`: the memory cache is expanded to the beams
    and reordered with them in its own layout (the batch axis of every ring). The search
    runs in compiled pieces of about `PIECE_S` seconds and at most `DECODE_CHUNK` steps
    (Ctrl-C is handled between two); once it has run `PROGRESS_AFTER_S` seconds, each piece
    logs its step on this module's logger (INFO), since a search shows nothing until its end."""
    settings = settings or model.config.with_memory()
    if max_new_tokens == 0:
        return np.zeros((0,), "int32")
    key = ("beam", settings.to_json(), sampler.num_beams, max_new_tokens, stops)
    search = _compiled(model, key, lambda: _compiled_beam(model, settings, sampler.num_beams, max_new_tokens,
                                                          stops))
    cache = prompt_cache(model, np.asarray(prompt, "int32")[None], settings)
    cache = cache.repeated(sampler.num_beams)
    beams = sampler.num_beams
    state = (ops.convert_to_tensor(0, "int32"), ops.full((beams,), int(prompt[-1]), "int32"),
             ops.zeros((beams,), "float32"), ops.zeros((beams,), "bool"), ops.zeros((beams,), "int32"),
             ops.zeros((beams, max_new_tokens), "int32"), cache)
    started, piece, step = time.monotonic(), 1, 0
    while True:
        piece_started = time.monotonic()
        state = search(ops.convert_to_tensor(piece, "int32"), *state)
        last_step, step, finished = step, int(ops.convert_to_numpy(state[0])), ops.convert_to_numpy(state[3])
        if step >= max_new_tokens or finished.all():
            break
        per_step = (time.monotonic() - piece_started) / max(step - last_step, 1)
        piece = int(np.clip(PIECE_S / max(per_step, 1e-9), 1, DECODE_CHUNK))
        if time.monotonic() - started >= PROGRESS_AFTER_S:
            logger.info("Beam search with %d beams: step %d of at most %d (%.0f s)", beams, step, max_new_tokens,
                        time.monotonic() - started)
    scores, lengths, sequences = (ops.convert_to_numpy(state[k]) for k in (2, 4, 5))
    normalized = scores / np.maximum(lengths, 1).astype("float64") ** sampler.length_penalty
    best = int(np.argmax(normalized))
    return sequences[best, : int(lengths[best])].astype("int32")


def _compiled_beam(model, settings, beams, steps, stops):
    compile_model, model = model, weakref.proxy(model)
    memory = step_memory(settings)
    stop_ids = ops.convert_to_tensor(list(stops) or [-1], "int32")

    def search(piece, start, last, scores, finished, lengths, sequences, cache):
        """Up to `piece` steps of the search from its state at step `start`."""
        end = ops.minimum(start + piece, steps)

        def cond(i, last, scores, finished, lengths, sequences, cache):
            return ops.logical_and(i < end, ops.logical_not(ops.all(finished)))

        def body(i, last, scores, finished, lengths, sequences, cache):
            out, cache = model.call_with_cache(last[:, None], cache, return_log_probs=True, **memory)
            log_probs = ops.cast(out["log_probs"][:, 0], "float32")
            vocabulary = ops.shape(log_probs)[1]
            # a finished beam continues only with its stop token, at no cost
            repeat = ops.where(ops.arange(vocabulary)[None] == last[:, None], 0.0, -np.inf)
            log_probs = ops.where(finished[:, None], repeat, log_probs)
            # at the first step every beam is the prompt: only the first one spreads
            first = ops.logical_and(i == 0, ops.arange(beams) > 0)
            total = ops.where(first[:, None], -np.inf, scores[:, None] + log_probs)
            scores, flat = ops.top_k(ops.reshape(total, (-1,)), beams)
            beam, token = flat // vocabulary, ops.cast(flat % vocabulary, "int32")
            was_finished = ops.take(finished, beam, axis=0)
            lengths = ops.take(lengths, beam, axis=0) + ops.cast(ops.logical_not(was_finished), "int32")
            sequences = ops.slice_update(ops.take(sequences, beam, axis=0), (0, i), token[:, None])
            stopped = ops.any(ops.equal(token[:, None], stop_ids[None]), axis=1)
            cache = cache.reordered(beam)
            return i + 1, token, scores, ops.logical_or(was_finished, stopped), lengths, sequences, cache

        return ops.while_loop(cond, body, (start, last, scores, finished, lengths, sequences, cache))

    return compile_for_backend(compile_model, search)


def stream(model, prompt, max_new_tokens, sampler, stops=(), settings=None, seed=0):
    """Yield the new tokens of one prompt (1-D ids) one at a time, each exactly the token
    `generate` gives at that place for the same sampler and seed."""
    if isinstance(sampler, BeamSampler):
        raise ValueError("Beam search chooses its tokens at the end; stream with a token-by-token sampler "
                         "(greedy, random, top_k, top_p).")
    settings = settings or model.config.with_memory()
    prompt = _check_ids(prompt, model.config.n_token)
    max_new_tokens = _check_count("max_new_tokens", max_new_tokens, 0)
    seeds = _per_row("seed", sampler.seed if sampler.seed is not None else seed, 1, 0)
    stops = _stops(stops, model.config.n_token)
    step = _compiled(model, ("stream", settings.to_json(), _sampler_key(sampler)),
                     lambda: _compiled_stream_step(model, settings, sampler))
    cache, last = prompt_cache(model, prompt[None], settings), ops.convert_to_tensor(prompt[-1:])
    inputs = _sampler_inputs(sampler)
    for i in range(max_new_tokens):
        last, cache = step(last, cache, ops.convert_to_tensor(seeds), ops.convert_to_tensor(i, "int32"), inputs)
        token = int(ops.convert_to_numpy(last)[0])
        yield token
        if token in stops:
            return


def _compiled_stream_step(model, settings, sampler):
    compile_model, model = model, weakref.proxy(model)

    def step(last, cache, seeds, i, sampler_inputs):
        return next_token(model, settings, _with_inputs(sampler, sampler_inputs), last, cache, seeds, i)

    return compile_for_backend(compile_model, step)


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


def _compiled_scorer(model, settings):
    """`step(tokens, targets, cache) -> (nll, cache)`, compiled for the backend."""
    compile_model, model = model, weakref.proxy(model)
    memory = step_memory(settings)

    def step(tokens, targets, cache):
        out, cache = model.call_with_cache(tokens, cache, targets=targets, **memory)
        return out["nll"], cache

    return compile_for_backend(compile_model, step)
