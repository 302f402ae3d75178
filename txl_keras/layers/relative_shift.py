"""The relative shift that aligns position scores with query-key distances."""

from keras import ops


def relative_shift(scores):
    """Turn scores indexed by position column into scores indexed by key.

    `scores[..., i, c]` holds the score of query `i` against the position encoding in
    column `c`, which encodes distance `K - c` for `c` in `[0, K]`. The result holds, at
    `[..., i, j]`, the score for distance `M + i - j` where `M = K - T`, i.e. query `i`
    against key `j`. Entries with `j > M + i` (future keys) are garbage and must be
    masked, as in the original.

    It is the original's pad-and-reshape trick without the pad: view the `(T, K + 1)`
    scores as `(K + 1, T)`, drop the first row and view the rest as `(T, K)`. The
    original pads a zero column where column 0 is here; its values only ever land on
    masked entries, so scoring one extra distance (`K`, a spare) saves the copy that a
    pad (and its gradient, a slice) would make.

    Args:
        scores: tensor of shape `(..., T, K + 1)` with `K >= T`.

    Returns:
        Tensor of shape `(..., T, K)`.
    """
    shape = ops.shape(scores)
    lead = list(shape[:-2])
    query_length, key_length = shape[-2], shape[-1] - 1
    flat = ops.reshape(scores, lead + [(key_length + 1) * query_length])
    # Dropping the first row of the (K + 1, T) view is dropping the first T entries.
    # With static sizes a split does it: its gradient is a concat, where a slice's
    # gradient builds and pads a full zero tensor (about a quarter of a training step).
    if isinstance(query_length, int) and isinstance(key_length, int):
        _, flat = ops.split(flat, [query_length], axis=-1)
    else:
        flat = flat[..., query_length:]
    return ops.reshape(flat, lead + [query_length, key_length])
