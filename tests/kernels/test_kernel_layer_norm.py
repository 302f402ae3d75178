"""`kernels.layer_norm` (its gradient written out) against its reference, against the numpy
re-derivation (values) and central differences of it in float64 (gradients)."""

import numpy as np
from conftest import central_differences, gradient, to_np
from keras import ops

import reference
from txl_keras.kernels import layer_norm, layer_norm_reference

EPS = 1e-5


def inputs(seed=0, shape=(3, 5, 8)):
    rng = np.random.default_rng(seed)
    # rows with their own offset and spread: a mean or a deviation left out shows
    x = rng.normal(size=shape) * rng.uniform(0.5, 3, size=shape[:-1] + (1,)) + rng.normal(size=shape[:-1] + (1,)) * 4
    gamma, beta = 1 + rng.normal(size=shape[-1]) * 0.5, rng.normal(size=shape[-1])
    weights = rng.uniform(0.5, 2, size=shape)  # an upstream gradient that is not 1 (nor the same per unit)
    return [a.astype("float32") for a in (x, gamma, beta, weights)]


def test_values_and_gradients_match_the_reference():
    x, gamma, beta, weights = inputs()
    np.testing.assert_allclose(to_np(layer_norm(x, gamma, beta, EPS)),
                               reference.layer_norm(x.astype(np.float64), gamma, beta, EPS), atol=2e-5)
    args = [x, gamma, beta]
    for k in range(3):
        def loss(a, k=k):  # the weighted sum of the reference, a function of argument k
            values = [v.astype(np.float64) for v in args]
            values[k] = a
            return (reference.layer_norm(*values, EPS) * weights).sum()

        def ours(v, k=k):  # (v * 1: a tensor, not TF's variable)
            values = list(args)
            values[k] = ops.multiply(v, 1.0)
            return ops.multiply(layer_norm(*values, EPS), weights)

        np.testing.assert_allclose(gradient(ours, args[k]), central_differences(loss, args[k]), atol=2e-3,
                                   err_msg=["x", "gamma", "beta"][k])


def test_the_kernel_equals_its_reference_in_values_and_gradients():
    x, gamma, beta, weights = inputs(seed=3)
    args = [x, gamma, beta]
    np.testing.assert_allclose(to_np(layer_norm(*args, EPS)), to_np(layer_norm_reference(*args, EPS)), atol=1e-5)
    for k in range(3):
        def weighted(norm, k=k):
            def f(v):
                values = list(args)
                values[k] = ops.multiply(v, 1.0)  # (a tensor, not TF's variable)
                return ops.multiply(norm(*values, EPS), weights)
            return f

        np.testing.assert_allclose(gradient(weighted(layer_norm), args[k]),
                                   gradient(weighted(layer_norm_reference), args[k]), atol=1e-4)
