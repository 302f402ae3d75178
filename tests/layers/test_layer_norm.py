"""LayerNorm: the layer norm of the paper with its gradient written out, against the numpy
reference (values) and central differences of it in float64 (gradients)."""

import keras
import numpy as np
import pytest
from conftest import central_differences, gradient, to_np
from keras import ops

import reference
from txl_keras.layers import LayerNorm
from txl_keras.layers.layer_norm import layer_norm

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


@pytest.mark.parametrize("dtype", ["float32", "mixed_bfloat16"])
def test_the_layer_is_keras_layer_normalization(dtype):
    x, gamma, beta, weights = inputs(seed=1)
    ours, theirs = LayerNorm(epsilon=EPS, dtype=dtype), keras.layers.LayerNormalization(epsilon=EPS, dtype=dtype)
    for layer in (ours, theirs):
        layer.build(x.shape)
        layer.gamma.assign(gamma)
        layer.beta.assign(beta)
    got, want = ours(x), theirs(x)
    assert keras.backend.standardize_dtype(got.dtype) == keras.backend.standardize_dtype(want.dtype)
    np.testing.assert_allclose(to_np(ops.cast(got, "float32")), to_np(ops.cast(want, "float32")),
                               atol=1e-5 if dtype == "float32" else 2e-2)
    if dtype == "float32":
        grads = [gradient(lambda v, layer=layer: ops.multiply(layer(ops.multiply(v, 1.0)), weights), x)
                 for layer in (ours, theirs)]
        np.testing.assert_allclose(grads[0], grads[1], atol=2e-4)


def test_other_axes_and_no_offset_are_keras_own():
    x = inputs(seed=2)[0]
    for kwargs in (dict(axis=(1, 2)), dict(center=False)):
        ours, theirs = LayerNorm(**kwargs), keras.layers.LayerNormalization(**kwargs)
        np.testing.assert_allclose(to_np(ours(x)), to_np(theirs(x)), atol=1e-5)


def test_serialization_round_trip():
    layer = LayerNorm(epsilon=1e-3, name="norm")
    restored = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(layer))
    assert type(restored) is LayerNorm and restored.get_config() == layer.get_config()
