"""The relative shift without a pad against the original's, and both against the definition."""

import numpy as np
import pytest
from conftest import gradient, to_np
from keras import ops

from txl_keras.kernels import relative_shift, relative_shift_reference


@pytest.mark.parametrize("length,memory", [(3, 0), (3, 5), (4, 4), (1, 6)])
def test_both_shifts_map_distances_to_keys(length, memory):
    rng = np.random.default_rng(0)
    keys = length + memory
    x = rng.normal(size=(2, length, keys + 1))  # column c: distance K - c, the first a spare
    fast = to_np(relative_shift(ops.array(x)))
    plain = to_np(relative_shift_reference(ops.array(x[..., 1:])))  # column c: distance K - 1 - c
    assert fast.shape == plain.shape == (2, length, keys)
    for i in range(length):
        for j in range(memory + i + 1):  # the unmasked region
            column = keys - (memory + i - j)
            np.testing.assert_allclose(fast[:, i, j], x[:, i, column])
            np.testing.assert_allclose(plain[:, i, j], x[:, i, column])


def test_gradients_reach_the_same_columns():
    rng = np.random.default_rng(1)
    length, memory = 3, 4
    keys = length + memory
    x = rng.normal(size=(2, length, keys + 1)).astype("float32")
    allowed = np.tril(np.ones((length, keys)), memory)
    weight = ops.convert_to_tensor((rng.normal(size=(2, length, keys)) * allowed).astype("float32"))
    fast = gradient(lambda v: relative_shift(ops.multiply(v, 1.0)) * weight, x)
    plain = gradient(lambda v: relative_shift_reference(ops.multiply(v, 1.0)) * weight, x[..., 1:])
    np.testing.assert_allclose(fast[..., 1:], plain, rtol=1e-6)
    np.testing.assert_array_equal(fast[..., 0], 0.0)  # the spare distance reaches only masked entries
