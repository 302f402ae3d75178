"""ReplicaDropout outside a multi-replica strategy: each unit kept when its 16 random
bits reach round(rate * 65536), kept units scaled so the expectation is exact."""

import keras
import numpy as np
import pytest
from conftest import to_np

from txl_keras.layers import ReplicaDropout


def expected_bits(seed, shape):
    """The backend's 16 bits per unit for a fresh generator of `seed`'s first draw,
    re-derived outside the layer: on TensorFlow the two halves of each 32-bit stateless
    Philox word (little-endian: the low half first), elsewhere `keras.random.randint`."""
    generator = keras.random.SeedGenerator(seed)
    size = int(np.prod(shape))
    if keras.backend.backend() != "tensorflow":
        return to_np(keras.random.randint(shape, 0, 1 << 16, dtype="int32", seed=generator))
    import tensorflow as tf

    state = generator.next()
    state = tf.cast(tf.math.floormod(state, tf.int32.max - 1), tf.int32)
    words = tf.random.stateless_uniform([(size + 1) // 2], state, minval=None, maxval=None, dtype=tf.uint32)
    return words.numpy().astype("<u4").view("<u2")[:size].reshape(shape).astype(np.float64)


@pytest.mark.parametrize("shape", [(16, 32), (3, 5, 7)])  # an even and an odd number of units
def test_mask_and_scale_against_the_bits(shape):
    x = to_np(keras.random.uniform(shape, seed=0)) + 1.0
    rate = 0.3
    threshold = round(rate * 65536)
    expected = np.where(expected_bits(7, shape) >= threshold, x * 65536 / (65536 - threshold), 0.0)
    out = to_np(ReplicaDropout(rate, seed=7)(keras.ops.convert_to_tensor(x, "float32"), training=True))
    np.testing.assert_allclose(out, expected, rtol=1e-6)
    np.testing.assert_array_equal(out == 0, expected == 0)


def within(fraction, p, n, sigmas=4):
    return abs(fraction - p) < sigmas * np.sqrt(p * (1 - p) / n)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_rate_and_the_expectation_hold_in_every_dtype(dtype):
    """With 16 bits per unit a rate of 0.1 drops 10% of the units in bfloat16 too (a
    uniform draw in bfloat16, Keras Dropout's, drops 10.15%: 10 sigma off at 4 M units),
    and the kept units' scale makes the mean output the input's."""
    layer = ReplicaDropout(0.1, seed=5, dtype=dtype)
    x = keras.ops.ones((2000, 2000), dtype=dtype)
    out = to_np(layer(x, training=True))
    assert within((out == 0).mean(), 0.1, out.size)
    kept = out[out != 0]
    np.testing.assert_allclose(kept, 65536 / (65536 - 6554), rtol=1e-6 if dtype == "float32" else 4e-3)
    if dtype == "float32":
        assert abs(out.mean() - 1) < 4 * np.sqrt(0.1 / 0.9 / out.size)
    pairs = (out == 0).reshape(-1, 2)  # the two units of one 32-bit word on TensorFlow
    assert within((pairs[:, 0] & pairs[:, 1]).mean(), 0.01, len(pairs))  # independent
    again = to_np(layer(x, training=True))
    assert within(((out == 0) & (again == 0)).mean(), 0.01, out.size)  # each call draws anew
    np.testing.assert_array_equal(to_np(layer(x)), to_np(x))  # not training: the input


def test_unknown_shapes_in_a_graph():
    if keras.backend.backend() != "tensorflow":
        pytest.skip("tf.function with an unknown shape")
    import tensorflow as tf

    layer = ReplicaDropout(0.5, seed=3)
    call = tf.function(lambda x: layer(x, training=True), input_signature=[tf.TensorSpec([None, None])])
    out = call(tf.ones((33, 41))).numpy()
    assert out.shape == (33, 41) and within((out == 0).mean(), 0.5, out.size)
    assert set(np.unique(out)) == {0.0, 2.0}


def test_rates_round_to_multiples_of_2_to_the_minus_16():
    x = keras.ops.ones((64, 64))
    np.testing.assert_array_equal(to_np(ReplicaDropout(1e-6, seed=1)(x, training=True)), 1.0)  # rounds to 0
    out = to_np(ReplicaDropout(1 - 1e-7, seed=1)(x, training=True))  # at most 65535/65536
    assert set(np.unique(out)) <= {0.0, 65536.0}


def test_rate_scaling_and_config():
    x = keras.ops.ones((200, 100))
    out = to_np(ReplicaDropout(0.25, seed=1)(x, training=True))
    np.testing.assert_allclose(out[out != 0], 1 / 0.75, rtol=1e-6)
    assert abs((out == 0).mean() - 0.25) < 5 * np.sqrt(0.25 * 0.75 / out.size)
    layer = ReplicaDropout.from_config(ReplicaDropout(0.25, seed=3, name="d").get_config())
    assert (layer.rate, layer.seed, layer.name) == (0.25, 3, "d")
    assert ReplicaDropout(0.0).seed_generator is None
    with pytest.raises(ValueError, match=r"ReplicaDropout: expected `rate` to be a dropout rate, a number in \[0, 1\)"):
        ReplicaDropout(1.0)


@pytest.mark.skipif(keras.backend.backend() != "jax", reason="keras.distribution on JAX")
def test_data_parallel_devices_get_their_own_masks():
    """Under keras.distribution the mask is drawn for the global batch and sharded, so
    each device's rows get their own part of it."""
    import jax

    devices = jax.devices()
    if len(devices) < 2:
        pytest.skip("needs two devices (XLA_FLAGS=--xla_force_host_platform_device_count=2)")
    distribution = keras.distribution.DataParallel(devices=devices[:2])
    layer = ReplicaDropout(0.3, seed=5)
    x = keras.ops.ones((8, 256))
    with distribution.scope():
        x = jax.device_put(x, distribution.get_data_layout(x.shape).backend_layout)
        out = to_np(jax.jit(lambda v: layer(v, training=True))(x))
    first, second = out[:4] == 0, out[4:] == 0  # the rows of device 0 and of device 1
    assert not np.array_equal(first, second)
    for mask in (first, second):
        assert abs(mask.mean() - 0.3) < 5 * np.sqrt(0.21 / mask.size)
    assert abs((first & second).mean() - 0.09) < 5 * np.sqrt(0.09 * 0.91 / first.size)
