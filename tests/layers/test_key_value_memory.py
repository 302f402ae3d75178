import numpy as np
import pytest
from conftest import to_np

from txl_keras.layers import KeyValueMemory
from txl_keras.layers.key_value_memory import head_major, ring_rows, time_major


@pytest.mark.parametrize("mem_len,segment,capacity", [
    (6, 2, 6), (7, 3, 7), (2, 5, 2), (4, 4, 4),
    (10, 4, 10),  # pieces of 2 rows, a segment wraps around the ring's end (wt103: 1,600 and 128)
    (6, 4, 6),  # the same, with mem_len not a multiple of the segment
    (7, 9, 9),  # 9 pieces of one row would be more than MAX_WRITES: a ring of whole segments
])
def test_read_is_the_last_mem_len_rows_appended_in_order(mem_len, segment, capacity):
    # Reference: the plain shifting memory (concatenate, keep the last mem_len rows).
    rng = np.random.default_rng(0)
    start = rng.normal(size=(2, 2, mem_len, 6)).astype("float32")
    memory = KeyValueMemory(mem_len, num_layers=2, width=6, batch_size=2, segment_length=segment, num_heads=3)
    assert memory.capacity == capacity
    memory.reset(list(start), 1)
    want, valid = list(start), 1
    for step in range(9):  # the ring wraps around several times
        kvs, count = memory.read()
        rings, offset, ring_count = memory.read_rings()
        for got, ring, expected in zip(kvs, rings, want):
            np.testing.assert_array_equal(to_np(got), expected)
            assert tuple(ring.shape) == (6, 2, capacity, 1)  # head-major: 2 * 3 heads of one dimension
            np.testing.assert_array_equal(to_np(ring_rows(ring, offset, mem_len)), head_of(expected, 3))
        assert int(count) == valid == int(ring_count)
        rows = rng.normal(size=(2, 2, segment, 6)).astype("float32")
        valid = min(mem_len, valid + segment)
        memory.append(list(rows), valid)
        want = [np.concatenate([w, r], axis=1)[:, -mem_len:] for w, r in zip(want, rows)]
    memory.reset()
    kvs, count = memory.read()
    assert int(count) == 0 and not np.any(to_np(kvs[0]))


def head_of(kv, heads):
    """Reference head-major layout by loops: `[j, b, t, d] = kv[b, t, j * Dh + d]`."""
    batch, length, width = kv.shape
    dim = width // (2 * heads)
    out = np.zeros((2 * heads, batch, length, dim), kv.dtype)
    for j in range(2 * heads):
        for d in range(dim):
            out[j, :, :, d] = kv[:, :, j * dim + d]
    return out


def test_head_major_and_back():
    kv = np.random.default_rng(1).normal(size=(3, 5, 12)).astype("float32")
    for heads in (1, 2, 3):
        np.testing.assert_array_equal(to_np(head_major(kv, heads)), head_of(kv, heads))
        np.testing.assert_array_equal(to_np(time_major(head_major(kv, heads))), kv)


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="segment_length"):
        KeyValueMemory(4, 1, 2, batch_size=1, segment_length=0)
    with pytest.raises(ValueError, match="multiple of 2 \\* num_heads = 4"):
        KeyValueMemory(4, 1, 6, batch_size=1, segment_length=2, num_heads=2)
    memory = KeyValueMemory(4, 1, 2, batch_size=1, segment_length=2)
    with pytest.raises(ValueError, match=r"shape \(batch_size, 2, 2\)"):
        memory.append([np.zeros((1, 3, 2), "float32")], 3)
    config = memory.get_config()
    assert KeyValueMemory.from_config(config).capacity == 4 and config["segment_length"] == 2


def test_reset_broadcasts_one_row_to_every_slot():
    row = np.random.default_rng(2).normal(size=(2, 1, 4)).astype("float32")
    memory = KeyValueMemory(5, num_layers=1, width=4, batch_size=2, segment_length=2, num_heads=2)
    memory.reset([row], 5)
    kvs, valid = memory.read()
    np.testing.assert_array_equal(to_np(kvs[0]), np.repeat(row, 5, axis=1))
    assert int(valid) == 5
