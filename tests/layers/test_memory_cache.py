import keras
import numpy as np
import pytest
from conftest import gradient, to_np

from txl_keras.layers import MemoryCache


def test_keeps_last_mem_len_positions_of_memory_and_input():
    cache = MemoryCache(mem_len=5, num_layers=2, hidden_dim=3)
    a = np.arange(2 * 3 * 3, dtype="float32").reshape(2, 3, 3)
    b = -np.arange(2 * 4 * 3, dtype="float32").reshape(2, 4, 3)
    first = cache([a, a + 100])
    assert to_np(first[0]).shape == (2, 3, 3)  # fewer than mem_len positions so far
    second = cache([b, b + 100], first)
    joined = np.concatenate([a, b], 1)
    np.testing.assert_array_equal(to_np(second[0]), joined[:, -5:])
    np.testing.assert_array_equal(to_np(second[1]), joined[:, -5:] + 100)


def test_ext_len_positions_are_not_cached():
    cache = MemoryCache(mem_len=10, num_layers=1, hidden_dim=2, ext_len=2)
    x = np.arange(12, dtype="float32").reshape(1, 6, 2)
    np.testing.assert_array_equal(to_np(cache([x])[0]), x[:, :4])


def test_mem_len_zero_keeps_nothing():
    cache = MemoryCache(mem_len=0, num_layers=1, hidden_dim=2)
    assert to_np(cache([np.ones((3, 4, 2), "float32")])[0]).shape == (3, 0, 2)


def test_stateful_read_write_reset():
    cache = MemoryCache(mem_len=3, num_layers=2, hidden_dim=2, stateful=True, batch_size=4)
    assert len(cache.non_trainable_variables) == 3 and not cache.weights
    mems, valid = cache.read()
    assert int(to_np(valid)) == 0 and to_np(mems[0]).shape == (4, 3, 2)
    cache.write([np.ones((4, 3, 2), "float32")] * 2, 2)
    mems, valid = cache.read()
    assert int(to_np(valid)) == 2 and to_np(mems[1]).sum() == 24
    cache.reset()
    mems, valid = cache.read()
    assert int(to_np(valid)) == 0 and to_np(mems[1]).sum() == 0
    zero_init = MemoryCache(mem_len=3, num_layers=1, hidden_dim=2, stateful=True, batch_size=1,
                            zero_init=True)
    assert int(to_np(zero_init.read()[1])) == 3


def test_no_gradient_flows_into_memory():
    cache = MemoryCache(mem_len=4, num_layers=1, hidden_dim=2)
    x = np.ones((1, 3, 2), "float32")
    assert np.all(gradient(lambda v: cache([v * 2.0])[0], x) == 0)
    assert np.all(gradient(lambda v: v * 2.0, x) == 2)  # the helper does see gradients


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="mem_len"):
        MemoryCache(mem_len=-1, num_layers=1, hidden_dim=2)
    with pytest.raises(ValueError, match="batch_size"):
        MemoryCache(mem_len=2, num_layers=1, hidden_dim=2, stateful=True)
    with pytest.raises(ValueError, match="stateful=False"):
        MemoryCache(mem_len=2, num_layers=1, hidden_dim=2).reset()


def test_serialization_round_trip():
    cache = MemoryCache(mem_len=3, num_layers=2, hidden_dim=4, ext_len=1, zero_init=True)
    restored = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(cache))
    assert restored.get_config() == cache.get_config()
