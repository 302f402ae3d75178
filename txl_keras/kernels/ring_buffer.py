"""Appending rows to a ring buffer: in place, or by the plain shift of the memory."""

from keras import ops


def ring_rows(ring, offset, length):
    """The last `length` rows of a ring `(G, B, capacity, W)` whose oldest row is at slot
    `offset`, in time order: `(G, B, length, W)`."""
    capacity = ring.shape[2]
    return ops.roll(ring, -offset, axis=2)[:, :, capacity - length:]


def append_rows_reference(ring, offset, rows):
    """The memory's update: the last `capacity` rows of `[ring in time order, rows]`.

    Args:
        ring: `(G, B, capacity, W)`, its oldest row at slot `offset` (an int32 scalar).
        rows: `(G, B, T, W)`, the newest rows.

    Returns:
        `(ring, offset)` after the append; this one writes the rows in time order, so its
        offset is 0.
    """
    capacity = ring.shape[2]
    joined = ops.concatenate([ring_rows(ring, offset, capacity), ops.cast(rows, ring.dtype)], axis=2)
    return joined[:, :, ops.shape(joined)[2] - capacity:], ops.zeros((), "int32")


def append_rows(ring, offset, rows, piece):
    """`append_rows_reference` as in-place writes of the oldest slots, `piece` rows at a
    time: one dynamic update each, which XLA performs in place on a variable's buffer
    (shifting the memory instead moves all of it every segment). Exact when no piece
    wraps around the ring's end: a single row, or `piece` dividing the capacity and
    `offset` a multiple of it (`CacheStore` keeps both)."""
    capacity, length = ring.shape[2], rows.shape[2]
    rows = ops.cast(rows, ring.dtype)
    for start in range(0, length, piece):  # in time order: later rows win
        slot = (offset + start) % capacity
        ring = ops.slice_update(ring, [0, 0, slot, 0], rows[:, :, start:start + piece])
    return ring, (offset + length) % capacity
