"""ReplicaDropout outside a multi-replica strategy: the draws of Keras Dropout."""

import keras
import numpy as np
import pytest
from conftest import to_np

from txl_keras.layers import ReplicaDropout


def test_one_replica_draws_the_masks_of_keras_dropout():
    x = keras.random.uniform((16, 32), seed=0) + 1.0
    ours, theirs = ReplicaDropout(0.3, seed=7), keras.layers.Dropout(0.3, seed=7)
    for _ in range(3):  # the generator advances once per call, the same way
        np.testing.assert_array_equal(to_np(ours(x, training=True)), to_np(theirs(x, training=True)))
    np.testing.assert_array_equal(to_np(ours(x)), to_np(x))


def test_rate_scaling_and_config():
    x = keras.ops.ones((200, 100))
    out = to_np(ReplicaDropout(0.25, seed=1)(x, training=True))
    np.testing.assert_allclose(out[out != 0], 1 / 0.75, rtol=1e-6)
    assert abs((out == 0).mean() - 0.25) < 5 * np.sqrt(0.25 * 0.75 / out.size)
    layer = ReplicaDropout.from_config(ReplicaDropout(0.25, seed=3, name="d").get_config())
    assert (layer.rate, layer.seed, layer.name) == (0.25, 3, "d")
    assert ReplicaDropout(0.0).seed_generator is None
    with pytest.raises(ValueError, match=r"rate must be in \[0, 1\)"):
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
