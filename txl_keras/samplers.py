"""Samplers: how generation picks the next token, with KerasHub's names and meanings.

    GreedySampler()                          the most likely token
    RandomSampler(temperature, seed)         a draw from softmax(log_probs / temperature)
    TopKSampler(k, temperature, seed)        ... among the k most likely tokens
    TopPSampler(p, temperature, seed, k)     ... among the smallest set whose probability
                                             reaches p (the most likely token always kept)
    BeamSampler(num_beams, length_penalty)   beam search

`get("top_k")` (what `TransformerXLCausalLM.compile(sampler=...)` takes) gives a sampler
by name with KerasHub's defaults (k=5, p=0.1, num_beams=5), or passes a sampler through.

A sampler owns its search, as KerasHub's do: `begin` lays out its state (`SearchState`)
and `search` runs its token loop, one `keras.ops.while_loop` of up to `steps` steps, with
`next(last, cache, in_place)` -> `(log-probabilities (streams, n_token), cache)`, the
model's step against the memory, given by the caller (`txl_keras.generate`, the SavedModel).
A token sampler maps log-probabilities `(batch_size, n_token)` and one key per row, int32
`(batch_size, 2)` = (seed, how many tokens that row has generated), to token ids int32
`(batch_size,)` (`get_next_token`); its search takes one token per row and step. Beam
search keeps `num_beams` streams per prompt and reorders them (and their memory) at every
step. A new search strategy is one subclass: `get_next_token` (a token sampler), or
`choose` (one step's tokens and the streams they continue), with `begin` and
`best_streams` where it keeps several streams per prompt.

A draw is a pure function of its row's key and log-probabilities: a prompt gives the same
text alone or in any batch, for the same seed. Draws use `keras.ops` and one stateless
uniform draw per row and backend (Gumbel-max), so generation runs compiled on TensorFlow,
JAX and PyTorch.
"""

import math
import random
from typing import NamedTuple

import keras
import numpy as np
from keras import ops

from txl_keras import kernels


def argmax(x):
    """int32 index of each row's largest value (`kernels.last_axis_argmax`)."""
    fast = kernels.fast_kernels_enabled()
    return kernels.last_axis_argmax(x) if fast else kernels.last_axis_argmax_reference(x)


def row_uniform(keys, n):
    """Uniform numbers in (0, 1), float32 `(batch_size, n)`; row r a pure function of `keys[r]`."""
    backend = keras.config.backend()
    if backend == "tensorflow":
        import tensorflow as tf

        return tf.map_fn(lambda key: tf.random.stateless_uniform([n], key, minval=1e-12, maxval=1.0), keys,
                         fn_output_signature=tf.float32)
    if backend == "jax":
        import jax

        def one(key):
            return jax.random.uniform(jax.random.fold_in(jax.random.PRNGKey(key[0]), key[1]), (n,),
                                      minval=1e-12, maxval=1.0)

        return jax.vmap(one)(keys)
    import torch

    rows = []
    for seed, step in ops.convert_to_numpy(keys).astype(np.int64).tolist():
        generator = torch.Generator(device=keys.device).manual_seed(seed * 1_000_003 + step)
        rows.append(torch.rand(n, generator=generator, device=keys.device).clamp_min(1e-12))
    return torch.stack(rows)


def _is_number(value):
    """A finite real number: a Python or numpy int or float, never a bool."""
    return isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, (bool, np.bool_)) \
        and math.isfinite(value)


def _is_integer(value):
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


# The smallest temperature a division in float32 keeps finite: below it the draw is greedy's.
_TINIEST_TEMPERATURE = float(np.finfo(np.float32).tiny)


def scaled_logits(log_probs, temperature):
    """float32 `(log_probs - max) / temperature` of each row (`temperature` a number or a
    float32 scalar tensor): the most likely token at 0, so that a tiny temperature leaves it
    the only finite logit (greedy) instead of overflowing."""
    log_probs = ops.cast(log_probs, "float32")
    centered = log_probs - ops.max(log_probs, axis=-1, keepdims=True)
    return centered / ops.maximum(ops.cast(temperature, "float32"), _TINIEST_TEMPERATURE)


class SearchState(NamedTuple):
    """A search between two of its steps, one entry per stream (`streams` = prompts x
    `streams_per_prompt`).

    Fields:
        step: int32 scalar, the steps taken (every stream's count of new tokens).
        last: int32 `(streams,)`, each stream's last token.
        done: bool `(streams,)`, streams that have ended (at a stop token or their limit).
        lengths: int32 `(streams,)`, new tokens of each stream, its stop token included.
        scores: float32 `(streams,)`, each stream's log-likelihood (beam search's).
        cache: the streams' memory (`txl_keras.layers.InferenceCache`).
        limits: int32 `(streams,)`, the most new tokens of each stream.
        seeds: int32 `(streams,)`, each stream's seed.
    """

    step: object
    last: object
    done: object
    lengths: object
    scores: object
    cache: object
    limits: object
    seeds: object


def _stopped(token, stop_ids):
    """bool `(streams,)`: `token` is one of `stop_ids` (int32 `(S,)`, -1 for none)."""
    return ops.any(ops.equal(token[:, None], stop_ids[None]), axis=1)


def _record(buffer, i, values):
    """`buffer` `(streams, width)` with column `i` set to `values` `(streams,)`."""
    return ops.slice_update(buffer, (0, i), values[:, None])


class Sampler:
    """Base class: a sampler's search (`begin`, `search`, `best_streams`), one loop for
    every sampler, taking the tokens `choose` gives at each step. A token sampler,
    `sampler(log_probs, keys)` -> int32 `(batch_size,)`, implements `get_next_token`.

    Args:
        temperature: float > 0, divides the log-probabilities before a draw.
        seed: int in [0, 2**31) or None (a new seed for every `generate` call).
    """

    streams_per_prompt = 1  # memory streams one prompt takes
    reorders_streams = False  # `choose` gives parents (the memory then follows them)
    streams_tokens = True  # each token is final once drawn (so `stream` can show it)
    draws = True  # takes a seed
    progress_name = "Generation"  # how its progress log line starts

    def __init__(self, temperature=1.0, seed=None):
        if not _is_number(temperature) or not temperature > 0:
            raise ValueError(f"Expected `temperature` to be a finite number > 0 (use GreedySampler for the most "
                             f"likely token). Received: temperature={temperature!r}")
        if seed is not None and (not _is_integer(seed) or not 0 <= seed < 2**31):
            raise ValueError(f"Expected `seed` to be an integer in [0, 2**31) or None. Received: seed={seed!r}")
        self.temperature = float(temperature)
        self.seed = None if seed is None else int(seed)

    def draw_seed(self):
        """The seed of one `generate` call: the sampler's, else a fresh one."""
        return random.randrange(2**31) if self.seed is None else self.seed

    def __call__(self, log_probs, keys):
        return self.get_next_token(log_probs, keys)

    def get_next_token(self, log_probs, keys):
        raise NotImplementedError

    def begin(self, last, cache, limits, seeds):
        """The state of a search of the prompts whose last tokens are `last` int32
        `(prompts,)` and memory `cache`, up to `limits` new tokens (int32 `(prompts,)`),
        drawn with `seeds` (int32 `(prompts,)`). A search whose streams stay in place
        writes the memory's rings in place from here on: `cache` is copied once
        (`InferenceCache.owned`), and every later piece of the search writes that copy."""
        streams = ops.shape(last)[0]
        cache = cache if self.reorders_streams else cache.owned()
        return SearchState(ops.convert_to_tensor(0, "int32"), last, limits <= 0, ops.zeros((streams,), "int32"),
                           ops.zeros((streams,), "float32"), cache, limits, seeds)

    def choose(self, log_probs, state):
        """One step's choice from `log_probs` float `(streams, n_token)`: `(tokens int32
        (streams,), parents, scores float32 (streams,))`, `parents` int32 `(streams,)` the
        stream each continues (its memory and tokens so far), or None: each its own. A
        token sampler draws a token per stream keyed `(seed, step)`; a stream that has
        ended repeats its last token."""
        keys = ops.stack([state.seeds, ops.full(ops.shape(state.seeds), state.step, "int32")], axis=1)
        token = ops.where(state.done, state.last, ops.cast(self(log_probs, keys), "int32"))
        return token, None, state.scores

    def search(self, next, state, steps, stop_ids, width):
        """Up to `steps` (int32 scalar, at most `width`) steps of the search, ending early
        once every stream is done: `(state, tokens int32 (streams, width): column i the
        token each stream took at step i of this call, parents: int32 (streams, width) the
        stream of the step before that each continued, or None when every stream continues
        itself, steps taken)`. A stream ends at one of `stop_ids` (int32 `(S,)`; `[-1]` for
        none) or at its limit. A search whose streams stay in place writes the memory's
        rings in place: `state` must come from `begin` or an earlier `search`, and nothing
        else may read its cache afterwards."""
        reorders = self.reorders_streams

        def cond(i, state, tokens, parents):
            return ops.logical_and(i < steps, ops.logical_not(ops.all(state.done)))

        def body(i, state, tokens, parents):
            log_probs, cache = next(state.last, state.cache, not reorders)
            token, parent, scores = self.choose(log_probs, state)
            was_done, lengths = state.done, state.lengths
            if reorders:
                was_done, lengths = ops.take(was_done, parent, axis=0), ops.take(lengths, parent, axis=0)
                cache, parents = cache.reordered(parent), _record(parents, i, parent)
            lengths = lengths + ops.cast(ops.logical_not(was_done), "int32")
            done = was_done | _stopped(token, stop_ids) | (state.step + 1 >= state.limits)
            state = state._replace(step=state.step + 1, last=token, done=done, lengths=lengths, scores=scores,
                                   cache=cache)
            return i + 1, state, _record(tokens, i, token), parents

        streams = ops.shape(state.last)[0]
        buffer = ops.zeros((streams, width), "int32")
        i, state, tokens, parents = ops.while_loop(
            cond, body, (ops.convert_to_tensor(0, "int32"), state, buffer,
                         buffer if reorders else ops.zeros((streams, 0), "int32")))
        return state, tokens, parents if reorders else None, i

    def best_streams(self, scores, lengths):
        """The stream whose tokens continue each prompt: int `(prompts,)`, from a finished
        search's `scores` and `lengths` (numpy `(streams,)`)."""
        return np.arange(len(lengths))

    def get_config(self):
        return {"temperature": self.temperature, "seed": self.seed}

    @classmethod
    def from_config(cls, config):
        return cls(**config)


class GreedySampler(Sampler):
    """The most likely token (deterministic)."""

    draws = False

    def __init__(self):
        super().__init__()

    def get_next_token(self, log_probs, keys):
        return argmax(log_probs)

    def get_config(self):
        return {}


class RandomSampler(Sampler):
    """A draw from `softmax(log_probs / temperature)`: the Gumbel-max of the (filtered)
    logits and one uniform row per key."""

    def filter(self, logits):
        """Logits with the excluded tokens at -inf."""
        return logits

    def get_next_token(self, log_probs, keys):
        logits = self.filter(scaled_logits(log_probs, self.temperature))
        gumbel = -ops.log(-ops.log(row_uniform(keys, ops.shape(logits)[-1])))
        return argmax(logits + gumbel)


def top_k_filter(logits, k):
    """`logits` with all but each row's `k` largest at -inf (`k` an int or a scalar tensor)."""
    kth = ops.top_k(logits, k)[0][:, -1:]
    return ops.where(logits < kth, -np.inf, logits)


class TopKSampler(RandomSampler):
    """A draw among the `k` most likely tokens (`k` >= 1)."""

    def __init__(self, k=5, temperature=1.0, seed=None):
        super().__init__(temperature, seed)
        if not _is_integer(k) or k < 1:
            raise ValueError(f"Expected `k` to be a positive integer. Received: k={k!r}")
        self.k = int(k)

    def filter(self, logits):
        return top_k_filter(logits, min(self.k, logits.shape[-1]))

    def get_config(self):
        return {"k": self.k, **super().get_config()}


class TopPSampler(RandomSampler):
    """Nucleus sampling: a draw among the smallest set of most likely tokens whose
    probability reaches `p` (0 < p <= 1); the most likely token is always kept. `k` (None
    or >= 1) first keeps only the k most likely."""

    def __init__(self, p=0.1, temperature=1.0, seed=None, k=None):
        super().__init__(temperature, seed)
        if not _is_number(p) or not 0.0 < p <= 1.0:
            raise ValueError(f"Expected `p` in (0, 1]. Received: p={p!r}")
        if k is not None and (not _is_integer(k) or k < 1):
            raise ValueError(f"Expected `k` to be None or a positive integer. Received: k={k!r}")
        self.p, self.k = float(p), None if k is None else int(k)

    def filter(self, logits):
        if self.k:
            logits = top_k_filter(logits, min(self.k, logits.shape[-1]))
        descending = ops.flip(ops.sort(logits, axis=-1), axis=-1)
        probs = ops.softmax(descending, axis=-1)
        before = ops.cumsum(probs, axis=-1) - probs  # mass of the more likely tokens
        # the most likely token always stays, whatever p rounds to in the compute dtype
        first = ops.arange(ops.shape(descending)[-1]) == 0
        kept = ops.where(ops.logical_or(before < self.p, first), descending, np.inf)
        threshold = ops.min(kept, axis=-1, keepdims=True)
        return ops.where(logits < threshold, -np.inf, logits)

    def get_config(self):
        return {"p": self.p, "k": self.k, **super().get_config()}


class BeamSampler(Sampler):
    """Beam search: the `num_beams` most likely continuations of each prompt are kept at
    every step (the memory reordered with them), and the best final beam by
    `log-likelihood / new_tokens ** length_penalty` is returned. `num_beams=1` is greedy.
    A beam that has ended (at a stop token or its limit) stays, at no cost, as it is.

    Args:
        num_beams: int >= 1.
        length_penalty: float >= 0 (0: the plain log-likelihood; 1: per token).
    """

    def __init__(self, num_beams=5, length_penalty=1.0):
        super().__init__()
        if not _is_integer(num_beams) or num_beams < 1:
            raise ValueError(f"Expected `num_beams` to be an integer >= 1. Received: num_beams={num_beams!r}")
        if not _is_number(length_penalty) or length_penalty < 0:
            raise ValueError(f"Expected `length_penalty` to be a finite number >= 0. Received: "
                             f"length_penalty={length_penalty!r}")
        self.num_beams, self.length_penalty = int(num_beams), float(length_penalty)

    streams_tokens = False  # a beam's tokens are known only when the search ends
    reorders_streams = True
    draws = False

    @property
    def streams_per_prompt(self):
        return self.num_beams

    @property
    def progress_name(self):
        return f"Beam search with {self.num_beams} beams"

    def begin(self, last, cache, limits, seeds):
        """Every prompt's state `num_beams` times in a row (its beams: streams
        `p * num_beams` to `(p + 1) * num_beams - 1`)."""
        beams = lambda x: ops.repeat(x, self.num_beams, axis=0)  # noqa: E731
        return super().begin(beams(last), cache.repeated(self.num_beams), beams(limits), beams(seeds))

    def choose(self, log_probs, state):
        """Each prompt's `num_beams` most likely continuations of its beams."""
        beams = self.num_beams
        streams = ops.shape(state.last)[0]
        first_beam = (ops.arange(streams) // beams) * beams  # the first stream of each stream's prompt
        log_probs = ops.cast(log_probs, "float32")
        vocabulary = ops.shape(log_probs)[1]
        # a beam that has ended continues only with its last token, at no cost
        repeat = ops.where(ops.arange(vocabulary)[None] == state.last[:, None], 0.0, -np.inf)
        log_probs = ops.where(state.done[:, None], repeat, log_probs)
        # at the first step every beam of a prompt is the prompt: only the first one spreads
        first = ops.logical_and(state.step == 0, ops.arange(streams) > first_beam)
        total = ops.where(first[:, None], -np.inf, state.scores[:, None] + log_probs)
        scores, flat = ops.top_k(ops.reshape(total, (-1, beams * vocabulary)), beams)
        parent = ops.cast(ops.reshape(flat // vocabulary, (-1,)) + first_beam, "int32")
        token = ops.cast(ops.reshape(flat % vocabulary, (-1,)), "int32")
        return token, parent, ops.reshape(scores, (-1,))

    def best_streams(self, scores, lengths):
        """Each prompt's beam of the best `scores / lengths ** length_penalty`."""
        normalized = scores / np.maximum(lengths, 1).astype("float64") ** self.length_penalty
        return np.argmax(normalized.reshape(-1, self.num_beams), axis=1) + np.arange(0, len(scores), self.num_beams)

    def get_config(self):
        return {"num_beams": self.num_beams, "length_penalty": self.length_penalty}


SAMPLERS = {"greedy": GreedySampler, "random": RandomSampler, "top_k": TopKSampler, "top_p": TopPSampler,
            "beam": BeamSampler}


def get(identifier):
    """A sampler: a name of `SAMPLERS` (with its defaults), a `Sampler`, or
    `{"class_name": name, "config": {...}}`."""
    if isinstance(identifier, Sampler):
        return identifier
    if isinstance(identifier, dict) and identifier.get("class_name") in SAMPLERS:
        return SAMPLERS[identifier["class_name"]].from_config(identifier.get("config", {}))
    if isinstance(identifier, str) and identifier in SAMPLERS:
        return SAMPLERS[identifier]()
    raise ValueError(f"Unknown sampler {identifier!r}: expected one of {sorted(SAMPLERS)} or a "
                     "txl_keras.samplers.Sampler.")


def sampler_from(temperature=1.0, top_k=0, top_p=1.0, seed=None):
    """The sampler of the usual command-line settings: `temperature` 0 is greedy, `top_k` 0
    and `top_p` 1 switch those filters off."""
    if not _is_number(temperature) or temperature < 0:
        raise ValueError(f"Expected `temperature` to be a finite number >= 0 (0: greedy). Received: "
                         f"temperature={temperature!r}")
    if not _is_integer(top_k) or top_k < 0:
        raise ValueError(f"Expected `top_k` to be a non-negative integer (0: all tokens). Received: top_k={top_k!r}")
    if not _is_number(top_p) or not 0.0 < top_p <= 1.0:
        raise ValueError(f"Expected `top_p` in (0, 1] (1: all tokens). Received: top_p={top_p!r}")
    if temperature == 0:
        return GreedySampler()
    if top_p < 1.0:
        return TopPSampler(top_p, temperature, seed, k=top_k or None)
    if top_k:
        return TopKSampler(top_k, temperature, seed)
    return RandomSampler(temperature, seed)
