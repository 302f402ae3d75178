"""Samplers: how the next token is picked from the model's log-probabilities.

Each sampler maps log-probabilities `(batch_size, n_token)` and a seed (int32 `(2,)`,
the generation seed and the step) to token ids int32 `(batch_size,)`. They use
`keras.ops`, plus one stateless categorical draw per backend, so generation runs
compiled on TensorFlow, JAX and PyTorch and is reproducible for a given seed.

    GreedySampler()                      the most likely token
    TemperatureSampler(temperature)      a draw from softmax(log_probs / temperature)
    TopKSampler(k, temperature)          ... among the k most likely tokens
    TopPSampler(p, temperature, k=0)     ... among the smallest set whose probability
                                         reaches p (the most likely token always kept)
"""

import keras
import numpy as np
from keras import ops


def stateless_categorical(logits, seed):
    """One draw per row of `logits` `(batch, n)`, a pure function of `seed` int32 `(2,)`."""
    backend = keras.config.backend()
    if backend == "tensorflow":
        import tensorflow as tf

        return tf.random.stateless_categorical(logits, 1, seed=seed, dtype=tf.int32)[:, 0]
    if backend == "jax":
        import jax

        key = jax.random.fold_in(jax.random.PRNGKey(seed[0]), seed[1])
        return jax.random.categorical(key, logits, axis=-1).astype("int32")
    import torch

    seed = ops.convert_to_numpy(seed).astype(np.int64)
    generator = torch.Generator(device=logits.device).manual_seed(int(seed[0]) * 1_000_003 + int(seed[1]))
    probs = torch.softmax(logits.float(), dim=-1)
    return torch.multinomial(probs, 1, generator=generator)[:, 0].int()


class Sampler:
    """Base class: `sampler(log_probs, seed)` -> int32 `(batch_size,)`."""

    def __call__(self, log_probs, seed):
        raise NotImplementedError

    def get_config(self):
        return {}


class GreedySampler(Sampler):
    """The most likely token (deterministic; the seed is unused)."""

    def __call__(self, log_probs, seed):
        return ops.cast(ops.argmax(log_probs, axis=-1), "int32")


class TemperatureSampler(Sampler):
    """A draw from `softmax(log_probs / temperature)` (`temperature` > 0)."""

    def __init__(self, temperature=1.0):
        if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or not temperature > 0:
            raise ValueError(f"Expected `temperature` > 0 (use GreedySampler for 0). Received: temperature={temperature!r}")
        self.temperature = float(temperature)

    def filter(self, logits):
        """Logits with the excluded tokens at -inf."""
        return logits

    def __call__(self, log_probs, seed):
        logits = self.filter(ops.cast(log_probs, "float32") / self.temperature)
        return stateless_categorical(logits, seed)

    def get_config(self):
        return {"temperature": self.temperature}


def _top_k_filter(logits, k):
    kth = ops.top_k(logits, k)[0][:, -1:]
    return ops.where(logits < kth, -np.inf, logits)


class TopKSampler(TemperatureSampler):
    """A draw among the `k` most likely tokens (`k` >= 1)."""

    def __init__(self, k, temperature=1.0):
        super().__init__(temperature)
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
            raise ValueError(f"Expected `k` to be a positive integer. Received: k={k!r}")
        self.k = int(k)

    def filter(self, logits):
        return _top_k_filter(logits, min(self.k, logits.shape[-1]))

    def get_config(self):
        return {"k": self.k, **super().get_config()}


class TopPSampler(TemperatureSampler):
    """Nucleus sampling: a draw among the smallest set of most likely tokens whose
    probability reaches `p` (0 < p <= 1); the most likely token is always kept. `k` > 0
    first keeps only the k most likely."""

    def __init__(self, p, temperature=1.0, k=0):
        super().__init__(temperature)
        if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0.0 < p <= 1.0:
            raise ValueError(f"Expected `p` in (0, 1]. Received: p={p!r}")
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 0:
            raise ValueError(f"Expected `k` to be a non-negative integer (0: no limit). Received: k={k!r}")
        self.p, self.k = float(p), int(k)

    def filter(self, logits):
        if self.k:
            logits = _top_k_filter(logits, min(self.k, logits.shape[-1]))
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


def sampler_from(temperature=1.0, top_k=0, top_p=1.0):
    """The sampler of the usual settings: `temperature` 0 is greedy, `top_k` 0 and
    `top_p` 1 switch those filters off."""
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or temperature < 0:
        raise ValueError(f"Expected `temperature` >= 0 (0: greedy). Received: temperature={temperature!r}")
    if isinstance(top_k, bool) or not isinstance(top_k, (int, np.integer)) or top_k < 0:
        raise ValueError(f"Expected `top_k` to be a non-negative integer (0: all tokens). Received: top_k={top_k!r}")
    if isinstance(top_p, bool) or not isinstance(top_p, (int, float)) or not 0.0 < top_p <= 1.0:
        raise ValueError(f"Expected `top_p` in (0, 1] (1: all tokens). Received: top_p={top_p!r}")
    if temperature == 0:
        return GreedySampler()
    if top_p < 1.0:
        return TopPSampler(top_p, temperature, k=top_k)
    if top_k:
        return TopKSampler(top_k, temperature)
    return TemperatureSampler(temperature)
