"""Samplers: how generation picks the next token, with KerasHub's names and meanings.

    GreedySampler()                          the most likely token
    RandomSampler(temperature, seed)         a draw from softmax(log_probs / temperature)
    TopKSampler(k, temperature, seed)        ... among the k most likely tokens
    TopPSampler(p, temperature, seed, k)     ... among the smallest set whose probability
                                             reaches p (the most likely token always kept)
    BeamSampler(num_beams, length_penalty)   beam search (`txl_keras.generate.beam_search`)

`get("top_k")` (what `TransformerXLCausalLM.compile(sampler=...)` takes) gives a sampler
by name with KerasHub's defaults (k=5, p=0.1, num_beams=5), or passes a sampler through.

A sampler maps log-probabilities `(batch_size, n_token)` and one key per row, int32
`(batch_size, 2)` = (seed, how many tokens that row has generated), to token ids int32
`(batch_size,)`. A draw is a pure function of its row's key and log-probabilities: a
prompt gives the same text alone or in any batch, for the same seed. Draws use
`keras.ops` and one stateless uniform draw per row and backend (Gumbel-max), so
generation runs compiled on TensorFlow, JAX and PyTorch.
"""

import math
import random

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
    """(`temperature` a number or a float32 scalar tensor) float32 `(log_probs - max) / temperature` of each row: the most likely token at 0, so
    that a tiny temperature leaves it the only finite logit (greedy) instead of overflowing."""
    log_probs = ops.cast(log_probs, "float32")
    centered = log_probs - ops.max(log_probs, axis=-1, keepdims=True)
    return centered / ops.maximum(ops.cast(temperature, "float32"), _TINIEST_TEMPERATURE)


class Sampler:
    """Base class: `sampler(log_probs, keys)` -> int32 `(batch_size,)`; subclasses
    implement `get_next_token`.

    Args:
        temperature: float > 0, divides the log-probabilities before a draw.
        seed: int in [0, 2**31) or None (a new seed for every `generate` call).
    """

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

    def get_config(self):
        return {"temperature": self.temperature, "seed": self.seed}

    @classmethod
    def from_config(cls, config):
        return cls(**config)


class GreedySampler(Sampler):
    """The most likely token (deterministic)."""

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
    """Beam search: the `num_beams` most likely continuations are kept at every step
    (the memory cache reordered with them), and the best final beam by
    `log-likelihood / new_tokens ** length_penalty` is returned. `num_beams=1` is greedy.

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

    def get_next_token(self, log_probs, keys):
        raise ValueError("BeamSampler picks whole continuations (txl_keras.generate.beam_search), not one token "
                         "at a time; use it through generate.")

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
