"""Dropout's random bits: TensorFlow's Philox halves (`tf_backend.random_bits`, two units per
32-bit word) against their reference, `keras.random.randint` (`replica_dropout.random_bits`
with the fast kernels off): both uniform over the 2**16 values, and independent units."""

import keras
import numpy as np
import pytest
from conftest import to_np

from txl_keras import kernels
from txl_keras.layers import replica_dropout


def histogram(bits, bins=64):
    return np.bincount((bits.astype(np.int64) * bins) >> 16, minlength=bins)


@pytest.mark.skipif(keras.config.backend() != "tensorflow", reason="TensorFlow's Philox bits")
def test_philox_halves_are_as_uniform_and_independent_as_the_reference():
    x = keras.ops.zeros((1000, 1001))  # an odd number of units: the last word's second half unused
    fast = to_np(replica_dropout.random_bits(x, keras.random.SeedGenerator(1))).ravel()
    with kernels.reference_kernels():
        plain = to_np(replica_dropout.random_bits(x, keras.random.SeedGenerator(1))).ravel()
    assert not np.array_equal(fast, plain)  # the two sources are different generators
    n, bins = fast.size, 64
    critical = bins - 1 + 5 * np.sqrt(2 * (bins - 1))  # chi-square with 63 degrees of freedom, 5 sigma
    for bits in (fast, plain):
        assert bits.min() >= 0 and bits.max() < 1 << 16
        counts = histogram(bits, bins)
        assert ((counts - n / bins) ** 2 / (n / bins)).sum() < critical
        pairs = bits[: n // 2 * 2].reshape(-1, 2) >= 1 << 15  # the two units of a 32-bit word
        both = (pairs[:, 0] & pairs[:, 1]).mean()
        assert abs(both - 0.25) < 5 * np.sqrt(0.25 * 0.75 / len(pairs))
