"""In-place appends to a ring buffer against the plain shift of the memory."""

import keras
import numpy as np
import pytest
from conftest import to_np
from keras import ops

from txl_keras.kernels.ring_buffer import append_rows, append_rows_reference, own, ring_rows, write_row_in_place
from txl_keras.layers.inference_cache import store_geometry


@pytest.mark.parametrize("mem_len,segment", [(6, 2), (7, 3), (10, 4), (6, 4), (7, 9), (5, 1)])
def test_in_place_appends_equal_the_shifted_memory(mem_len, segment):
    """Appends of equal segments in the pieces `store_geometry` chooses, and of one row at a
    time, keep the same rows in time order as the reference (and as numpy's shift)."""
    rng = np.random.default_rng(0)
    capacity, piece = store_geometry(mem_len, segment)
    start = rng.normal(size=(2, 3, capacity, 4)).astype("float32")
    fast = plain = ops.convert_to_tensor(start)
    fast_offset = plain_offset = ops.convert_to_tensor(0, "int32")
    shifted = start
    for step in range(9):  # the ring wraps around several times
        rows = rng.normal(size=(2, 3, segment, 4)).astype("float32")
        fast, fast_offset = append_rows(fast, fast_offset, rows, piece)
        plain, plain_offset = append_rows_reference(plain, plain_offset, rows)
        shifted = np.concatenate([shifted, rows], axis=2)[:, :, -capacity:]
        for ring, offset in ((fast, fast_offset), (plain, plain_offset)):
            np.testing.assert_array_equal(to_np(ring_rows(ring, offset, mem_len)), shifted[:, :, -mem_len:])
    single = ops.convert_to_tensor(start)
    offset = ops.convert_to_tensor(3 % capacity, "int32")
    ordered = to_np(ring_rows(single, offset, capacity))
    row = rng.normal(size=(2, 3, 1, 4)).astype("float32")
    single, offset = append_rows(single, offset, row, 1)  # one row never wraps
    np.testing.assert_array_equal(to_np(ring_rows(single, offset, capacity)),
                                  np.concatenate([ordered, row], axis=2)[:, :, 1:])


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_rows_written_in_place_equal_the_shifted_memory(dtype):
    """A token loop (compiled on TensorFlow) that reads the ring, then writes one row into a
    copy from `own`, reads at every step what the plain shift of the memory holds, ends with
    the same rows in time order, and leaves the ring it copied unchanged."""
    rng = np.random.default_rng(1)
    groups, batch, capacity, width, steps = 2, 3, 5, 4, 12  # wraps around twice
    start = ops.cast(rng.normal(size=(groups, batch, capacity, width)).astype("float32"), dtype)
    start_values = to_np(ops.cast(start, "float32"))
    rows = ops.cast(rng.normal(size=(steps, groups, batch, 1, width)).astype("float32"), dtype)

    def loop(ring, offset, write):
        def body(i, ring, offset, reads):
            ordered = ring_rows(ring, offset, capacity)  # a read of the whole ring, in time order
            weights = ops.cast(ops.arange(capacity, dtype="float32") + 1.0, ring.dtype)
            read = ops.cast(ops.sum(ordered * weights[:, None], axis=(0, 2, 3)), "float32")
            ring, offset = write(ring, offset, rows[i], read)
            return i + 1, ring, offset, ops.slice_update(reads, (i, 0), read[None])
        start_state = (ops.convert_to_tensor(0, "int32"), ring, offset, ops.zeros((steps, batch), "float32"))
        return ops.while_loop(lambda i, *_: i < steps, body, start_state)[1:]

    def in_place(ring, offset, row, read):
        return write_row_in_place(ring, offset, row, after=[read])

    def plain(ring, offset, row, read):
        return append_rows_reference(ring, offset, row)

    if keras.config.backend() == "tensorflow":
        import tensorflow as tf

        fast_loop = tf.function(lambda ring, offset: loop(own(ring), offset, in_place))
    else:
        fast_loop = lambda ring, offset: loop(own(ring), offset, in_place)  # noqa: E731
    offset = ops.convert_to_tensor(2, "int32")
    fast_ring, fast_offset, fast_reads = fast_loop(start, offset)
    plain_ring, plain_offset, plain_reads = loop(start, offset, plain)
    np.testing.assert_array_equal(to_np(fast_reads), to_np(plain_reads))
    np.testing.assert_array_equal(to_np(ops.cast(ring_rows(fast_ring, fast_offset, capacity), "float32")),
                                  to_np(ops.cast(ring_rows(plain_ring, plain_offset, capacity), "float32")))
    np.testing.assert_array_equal(to_np(ops.cast(start, "float32")), start_values)
