import numpy as np
import pytest
from conftest import to_np
from keras import ops

from txl_keras import kernels
from txl_keras.layers import CacheStore, InferenceCache
from txl_keras.layers.inference_cache import head_major, time_major


@pytest.mark.parametrize("fast", [True, False])
@pytest.mark.parametrize("mem_len,segment,capacity", [
    (6, 2, 6), (7, 3, 7), (2, 5, 2), (4, 4, 4),
    (10, 4, 10),  # pieces of 2 rows, a segment wraps around the ring's end (wt103: 1,600 and 128)
    (6, 4, 6),  # the same, with mem_len not a multiple of the segment
    (7, 9, 9),  # 9 pieces of one row would be more than MAX_WRITES: a ring of whole segments
])
def test_a_store_reads_the_last_mem_len_rows_appended_in_order(mem_len, segment, capacity, fast):
    # Reference: the plain shifting memory (concatenate, keep the last mem_len rows).
    rng = np.random.default_rng(0)
    start = rng.normal(size=(2, 2, mem_len, 6)).astype("float32")
    store = CacheStore(mem_len, num_layers=2, groups=6, width=1, batch_size=2, segment_length=segment)
    assert store.capacity == capacity
    store.reset(list(start), 1)
    want, valid = list(start), 1
    with kernels.reference_kernels() if not fast else _nothing():
        for step in range(9):  # the ring wraps around several times
            cache = store.read()
            for layer, expected in enumerate(want):
                ring = cache.rings[layer]
                assert tuple(ring.shape) == (6, 2, capacity, 1)  # head-major: 6 groups of one value
                np.testing.assert_array_equal(to_np(time_major(cache.rows(layer, mem_len))), expected)
            assert int(cache.valid) == valid
            rows = rng.normal(size=(2, 2, segment, 6)).astype("float32")
            valid = min(mem_len, valid + segment)
            store.append(list(rows), valid)
            want = [np.concatenate([w, r], axis=1)[:, -mem_len:] for w, r in zip(want, rows)]
    store.reset()
    cache = store.read()
    assert int(cache.valid) == 0 and not np.any(to_np(cache.rings[0]))


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *args):
        return False


@pytest.mark.parametrize("fast", [True, False])
def test_a_cache_appends_rows_as_the_memory_shifts(fast):
    """`InferenceCache.append` (one row in place with the fast kernels, more rows by the
    shift) keeps the last rows of everything appended, in order."""
    rng = np.random.default_rng(3)
    ring = rng.normal(size=(4, 1, 5, 2)).astype("float32")
    cache = InferenceCache((ops.convert_to_tensor(ring),), ops.convert_to_tensor(2, "int32"),
                           ops.convert_to_tensor(5, "int32"))
    want = np.roll(ring, -2, axis=2)
    with kernels.reference_kernels() if not fast else _nothing():
        for length in (3, 1, 1, 4, 1, 2):
            rows = rng.normal(size=(1, length, 8)).astype("float32")
            cache = cache.append([rows], 5)
            want = np.concatenate([want, to_np(head_major(rows, 4))], axis=2)[:, :, -5:]
            np.testing.assert_array_equal(to_np(cache.rows(0, 5)), want)


@pytest.mark.parametrize("turn_to", [None, 0, 2, 4])
def test_caches_of_streams_at_different_places_join_per_row(turn_to):
    """`per_row(offset)` turns each ring so that its oldest row sits at `offset`, with one
    count per stream: two caches at different offsets, joined on the batch axis, read each
    stream's own rows in time order (numpy: the ring rolled by its own offset)."""
    rng = np.random.default_rng(4)
    caches, want = [], []
    for offset, valid, batch in ((3, 2, 2), (0, 5, 1)):
        ring = rng.normal(size=(4, batch, 5, 2)).astype("float32")
        cache = InferenceCache((ops.convert_to_tensor(ring),), ops.convert_to_tensor(offset, "int32"),
                               ops.convert_to_tensor(valid, "int32"))
        caches.append(cache.per_row(None if turn_to is None else ops.convert_to_tensor(turn_to, "int32")))
        want.append((np.concatenate([ring[:, :, offset:], ring[:, :, :offset]], axis=2), [valid] * batch))
        assert int(caches[-1].offset) == (offset if turn_to is None else turn_to)
        np.testing.assert_array_equal(to_np(caches[-1].rows(0, 5)), want[-1][0])
    if turn_to is not None:
        joined = caches[0]._replace(rings=(ops.concatenate([c.rings[0] for c in caches], axis=1),))
        np.testing.assert_array_equal(to_np(joined.rows(0, 5)), np.concatenate([w for w, _ in want], axis=1))
    assert sum((to_np(c.valid).tolist() for c in caches), []) == [2, 2, 5]


def test_written_counts_the_rows_appended_up_to_the_capacity():
    """`written` grows by each append's rows and stops at the capacity; turned to it, the
    written rows lie in the first slots in time order."""
    cache = InferenceCache((ops.zeros((2, 1, 5, 1)),), ops.convert_to_tensor(0, "int32"),
                           ops.convert_to_tensor(0, "int32"), written=ops.convert_to_tensor(0, "int32"))
    counts, rows = [], []
    for length in (2, 1, 1, 3):
        new = np.arange(len(rows), len(rows) + length, dtype="float32") + 1
        rows += new.tolist()
        cache = cache.append([ops.convert_to_tensor(np.repeat(new, 2).reshape(1, length, 2))], 0)
        counts.append(int(cache.written))
    assert counts == [2, 3, 4, 5]
    partial = InferenceCache((ops.zeros((2, 1, 5, 1)),), ops.convert_to_tensor(0, "int32"),
                             ops.convert_to_tensor(0, "int32"), written=ops.convert_to_tensor(0, "int32"))
    partial = partial.append([ops.convert_to_tensor(np.repeat([1.0, 2.0, 3.0], 2).reshape(1, 3, 2))], 3)
    turned = partial.turned(partial.written)
    assert int(turned.offset) == 3
    assert to_np(turned.rings[0])[0, 0, :, 0].tolist() == [1.0, 2.0, 3.0, 0.0, 0.0]


def head_of(kv, groups):
    """Reference head-major layout by loops: `[j, b, t, d] = kv[b, t, j * W + d]`."""
    batch, length, width = kv.shape
    dim = width // groups
    out = np.zeros((groups, batch, length, dim), kv.dtype)
    for j in range(groups):
        for d in range(dim):
            out[j, :, :, d] = kv[:, :, j * dim + d]
    return out


def test_head_major_and_back():
    kv = np.random.default_rng(1).normal(size=(3, 5, 12)).astype("float32")
    for groups in (2, 4, 6):
        np.testing.assert_array_equal(to_np(head_major(kv, groups)), head_of(kv, groups))
        np.testing.assert_array_equal(to_np(time_major(head_major(kv, groups))), kv)


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="segment_length"):
        CacheStore(4, 1, 2, 1, batch_size=1, segment_length=0)
    with pytest.raises(ValueError, match="mem_len"):
        CacheStore(-1, 1, 2, 1, batch_size=1, segment_length=2)
    store = CacheStore(4, 1, 2, 1, batch_size=1, segment_length=2)
    with pytest.raises(ValueError, match=r"shape \(batch_size=1, 2, 2\)"):
        store.append([np.zeros((1, 3, 2), "float32")], 3)
    with pytest.raises(ValueError, match=r"shape \(batch_size=1, 2, 2\)"):
        store.append([np.zeros((2, 2, 2), "float32")], 2)  # another batch size
    config = store.get_config()
    assert CacheStore.from_config(config).capacity == 4 and config["segment_length"] == 2


def test_reset_broadcasts_one_row_to_every_slot():
    row = np.random.default_rng(2).normal(size=(2, 1, 4)).astype("float32")
    store = CacheStore(5, num_layers=1, groups=4, width=1, batch_size=2, segment_length=2)
    store.reset([row], 5)
    cache = store.read()
    np.testing.assert_array_equal(to_np(time_major(cache.rows(0, 5))), np.repeat(row, 5, axis=1))
    assert int(cache.valid) == 5


def test_the_named_conversions_move_whole_streams_and_layers():
    rng = np.random.default_rng(0)
    rings = tuple(rng.normal(size=(2, 3, 4, 5)).astype("float32") for _ in range(3))
    keys = tuple(rng.normal(size=(2, 5, 7)).astype("float32") for _ in range(3))
    cache = InferenceCache(tuple(ops.convert_to_tensor(r) for r in rings), ops.array(1, "int32"),
                           ops.array(2, "int32"), tuple(ops.convert_to_tensor(k) for k in keys))
    repeated = cache.repeated(2)
    for ring, want in zip(repeated.rings, rings):
        np.testing.assert_array_equal(ops.convert_to_numpy(ring), np.repeat(want, 2, axis=1))
    reordered = cache.reordered(ops.convert_to_tensor(np.array([2, 0, 0], "int32")))
    for ring, want in zip(reordered.rings, rings):
        np.testing.assert_array_equal(ops.convert_to_numpy(ring), want[:, [2, 0, 0]])
    middle = cache.layers(1, 2)
    assert len(middle.rings) == 1 and len(middle.position_keys) == 1
    np.testing.assert_array_equal(ops.convert_to_numpy(middle.position_keys[0]), keys[1])
    assert (int(reordered.offset), int(reordered.valid)) == (1, 2)
    rows = [c.per_row() for c in (cache, cache.reordered(ops.convert_to_tensor(np.array([1], "int32"))))]
    joined = InferenceCache.joined(rows)
    np.testing.assert_array_equal(ops.convert_to_numpy(joined.rings[0]), np.concatenate(
        [rings[0], rings[0][:, [1]]], axis=1))
    assert ops.convert_to_numpy(joined.valid).tolist() == [2, 2, 2, 2]


def test_a_count_per_stream_moves_with_its_stream():
    """Streams of prompts of different lengths (`per_row`) keep their own count of real
    rows when repeated for beams and reordered."""
    rings = (ops.convert_to_tensor(np.arange(2 * 3 * 4 * 1, dtype="float32").reshape(2, 3, 4, 1)),)
    cache = InferenceCache(rings, ops.array(0, "int32"), ops.convert_to_tensor(np.array([1, 3, 4], "int32")))
    repeated = cache.repeated(2)
    assert ops.convert_to_numpy(repeated.valid).tolist() == [1, 1, 3, 3, 4, 4]
    reordered = repeated.reordered(ops.convert_to_tensor(np.array([5, 0, 2], "int32")))
    assert ops.convert_to_numpy(reordered.valid).tolist() == [4, 1, 3]
    np.testing.assert_array_equal(ops.convert_to_numpy(reordered.rings[0]),
                                  ops.convert_to_numpy(rings[0])[:, [2, 0, 1]])
