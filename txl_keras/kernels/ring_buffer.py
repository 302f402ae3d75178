"""Appending rows to a ring buffer: in place, or by the plain shift of the memory."""

import keras
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


def own(ring):
    """A copy of `ring` in a buffer of its own, for `write_row_in_place` (JAX arrays are
    never written in place: the same array)."""
    backend = keras.config.backend()
    if backend == "tensorflow":
        import tensorflow as tf

        return tf.raw_ops.DeepCopy(x=ring)  # a new buffer: grappler may not fold it into an alias
    if backend == "torch":
        return ring.clone()
    return ring


def write_row_in_place(ring, offset, row, after=()):
    """`append_rows(ring, offset, row, 1)` written into the ring's own buffer once the
    tensors `after` exist: a generation step then moves one row per layer instead of
    copying the memory (TensorFlow's dynamic update copies a loop's tensor every step; a
    compiled JAX loop already updates in place, so there this is `append_rows`).

    The caller owns `ring`: a copy from `own` that no other tensor reads after the write,
    and every read of the old ring leads to `after` (the write follows them).

    Args:
        ring: `(G, B, capacity, W)`, its oldest row at slot `offset` (an int32 scalar).
        row: `(G, B, 1, W)`, the newest row.
        after: tensors computed from every read of the old ring.
    """
    backend = keras.config.backend()
    capacity = ring.shape[2]
    if backend == "tensorflow":
        import tensorflow as tf

        groups, batch, _, width = tf.unstack(tf.shape(ring))
        with tf.control_dependencies(list(after)):
            # row `offset` of every (group, stream): rows of the flat view, which aliases the buffer
            slots = tf.range(groups * batch) * capacity + offset
            flat = tf.raw_ops.InplaceUpdate(x=tf.reshape(ring, [-1, width]), i=slots,
                                            v=tf.reshape(tf.cast(row, ring.dtype), [-1, width]))
        written = tf.reshape(flat, tf.shape(ring))
        written.set_shape(ring.shape)
        return written, (offset + 1) % capacity
    if backend == "torch":
        import torch

        with torch.no_grad():
            ring.index_copy_(2, torch.reshape(offset, (1,)).long(), row.to(ring.dtype))
        return ring, (offset + 1) % capacity
    return append_rows(ring, offset, row, 1)
