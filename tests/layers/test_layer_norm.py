"""LayerNorm: Keras's LayerNormalization, computed by the fast kernel where it applies."""

import keras
import numpy as np
from conftest import gradient, to_np
from keras import ops
import pytest

from txl_keras import kernels
from txl_keras.layers import LayerNorm

EPS = 1e-5


def inputs(seed=0, shape=(3, 5, 8)):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=shape) * rng.uniform(0.5, 3, size=shape[:-1] + (1,)) + rng.normal(size=shape[:-1] + (1,)) * 4
    gamma, beta = 1 + rng.normal(size=shape[-1]) * 0.5, rng.normal(size=shape[-1])
    weights = rng.uniform(0.5, 2, size=shape)
    return [a.astype("float32") for a in (x, gamma, beta, weights)]


@pytest.mark.parametrize("dtype", ["float32", "mixed_bfloat16"])
def test_the_layer_is_keras_layer_normalization(dtype):
    x, gamma, beta, weights = inputs(seed=1)
    ours, theirs = LayerNorm(epsilon=EPS, dtype=dtype), keras.layers.LayerNormalization(epsilon=EPS, dtype=dtype)
    for layer in (ours, theirs):
        layer.build(x.shape)
        layer.gamma.assign(gamma)
        layer.beta.assign(beta)
    got, want = ours(x), theirs(x)
    with kernels.reference_kernels():
        np.testing.assert_array_equal(to_np(ops.cast(ours(x), "float32")), to_np(ops.cast(want, "float32")))
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
