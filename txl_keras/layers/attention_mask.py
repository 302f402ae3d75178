"""The causal mask of a segment attending to its memory and to itself."""

from keras import ops


def causal_attention_mask(query_length, memory_length, memory_valid=None, max_distance=None):
    """Which keys each query may attend to.

    Keys are the `memory_length` memory slots followed by the `query_length` current
    positions; query `i` sits at key position `memory_length + i`. Key `j` is visible
    when its distance `memory_length + i - j` is in `[0, max_distance]` and, if
    `memory_valid` is given, when it is not one of the `memory_length - memory_valid`
    oldest memory slots (empty slots of a stream's first segments).

    Args:
        query_length: int or scalar tensor, `T`.
        memory_length: int or scalar tensor, `M`.
        memory_valid: optional int scalar or `(batch_size,)` tensor (one count per row),
            how many of the most recent memory slots hold real positions. `None` means
            all `M`.
        max_distance: optional int, the `same_length` window: the original TF code
            uses `mem_len` (each query sees `mem_len + 1` keys), the PyTorch code
            `mem_len - 1` (`mem_len` keys). `None` for the plain causal mask.

    Returns:
        Boolean tensor of shape `(T, M + T)` (`(batch_size, T, M + T)` with a count per
        row), True where attention is allowed.
    """
    query_pos = ops.arange(query_length, dtype="int32")[:, None] + memory_length
    key_pos = ops.arange(memory_length + query_length, dtype="int32")[None, :]
    distance = query_pos - key_pos
    allowed = distance >= 0
    if max_distance is not None:
        allowed = ops.logical_and(allowed, distance <= max_distance)
    if memory_valid is not None:
        first_valid = memory_length - ops.cast(memory_valid, "int32")
        if len(first_valid.shape) == 1:  # one count per row
            first_valid = first_valid[:, None, None]
        allowed = ops.logical_and(allowed, key_pos >= first_valid)
    return allowed
