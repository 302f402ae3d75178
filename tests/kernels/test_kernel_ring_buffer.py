"""In-place appends to a ring buffer against the plain shift of the memory."""

import numpy as np
import pytest
from conftest import to_np
from keras import ops

from txl_keras.kernels.ring_buffer import append_rows, append_rows_reference, ring_rows
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
