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
