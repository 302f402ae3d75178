"""The relative shift: position scores indexed by distance -> scores indexed by key."""

from keras import ops


def relative_shift_reference(scores):
    """The original's shift (`rel_shift` of its tf/model.py): pad a zero column in front,
    view the `(T, K + 1)` rows as `(K + 1, T)`, drop the first row, view as `(T, K)`.

    Args:
        scores: `(..., T, K)`, column `c` the score against distance `K - 1 - c`, `K >= T`.

    Returns:
        `(..., T, K)`: at `[..., i, j]` the score for distance `M + i - j` (`M = K - T`),
        query `i` against key `j`. Entries with `j > M + i` (future keys) are garbage, to
        be masked.
    """
    shape = ops.shape(scores)
    lead = list(shape[:-2])
    query_length, key_length = shape[-2], shape[-1]
    padded = ops.pad(scores, [[0, 0]] * len(lead) + [[0, 0], [1, 0]])
    rows = ops.reshape(padded, lead + [key_length + 1, query_length])[..., 1:, :]
    return ops.reshape(rows, lead + [query_length, key_length])


def relative_shift(scores):
    """`relative_shift_reference` without the pad: one more distance is scored instead.

    Column 0 of the input holds a spare distance `K`, where the reference pads a zero: its
    values only ever land on masked entries, and scoring it saves the copy that a pad (and
    its gradient, a slice) would make. Dropping the first row of the `(K + 1, T)` view is
    dropping the first `T` entries; with static sizes a split does it, whose gradient is a
    concatenation, where a slice's gradient pads a full zero tensor.

    Args:
        scores: `(..., T, K + 1)`, column `c` the score against distance `K - c`.

    Returns:
        `(..., T, K)`, as `relative_shift_reference`.
    """
    shape = ops.shape(scores)
    lead = list(shape[:-2])
    query_length, key_length = shape[-2], shape[-1] - 1
    flat = ops.reshape(scores, lead + [(key_length + 1) * query_length])
    if isinstance(query_length, int) and isinstance(key_length, int):
        _, flat = ops.split(flat, [query_length], axis=-1)
    else:
        flat = flat[..., query_length:]
    return ops.reshape(flat, lead + [query_length, key_length])
