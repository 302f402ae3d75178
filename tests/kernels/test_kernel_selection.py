"""`last_axis_argmax` against numpy's argmax: random rows, ties (the first index wins),
rows of -inf but one, and the batch and vocabulary shapes of a generation step."""

import numpy as np
import pytest

from txl_keras import kernels


@pytest.mark.parametrize("kernel", [kernels.last_axis_argmax, kernels.last_axis_argmax_reference])
@pytest.mark.parametrize("shape", [(1, 7), (8, 1000), (2, 3, 50)])
def test_each_rows_largest_value_first_index_on_ties(kernel, shape):
    rng = np.random.default_rng(sum(shape))
    x = rng.integers(-3, 3, shape).astype("float32")  # few values: many ties
    x[..., 0] = -np.inf
    got = np.asarray(kernel(x))
    assert got.dtype == np.int32 and got.shape == shape[:-1]
    np.testing.assert_array_equal(got, np.argmax(x, axis=-1))
    log_probs = np.log(rng.dirichlet(np.ones(shape[-1]), shape[:-1])).astype("float32")
    np.testing.assert_array_equal(np.asarray(kernel(log_probs)), np.argmax(log_probs, axis=-1))


def test_a_single_finite_value_among_minus_infinities():
    x = np.full((3, 9), -np.inf, "float32")
    x[[0, 1, 2], [8, 0, 4]] = [-1e30, 0.0, -5.0]
    np.testing.assert_array_equal(np.asarray(kernels.last_axis_argmax(x)), [8, 0, 4])
