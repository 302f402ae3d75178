"""Fast kernels of relative attention, each beside the plain computation it replaces.

Layout: heads first. Queries `(h, B, T, Dh)`, keys and values `(h, B, K, Dh)`, scores
`(h, B, T, K)` (`h` heads, or a group of them), position keys `(h, Dh, P)`: column `c` the
projected encoding of distance `P - 1 - c`, where `P <= K` when the encoding is clamped
(every distance from `P - 1` on then shares column 0).
"""

import keras
from keras import ops

from txl_keras.kernels.relative_shift import relative_shift, relative_shift_reference

# Added to blocked scores in float32: the softmax runs in float32, so this neither
# overflows in float16/bfloat16 nor lets a blocked key through.
MASK_VALUE = -1e30


def _upstream(args, upstream):
    """The upstream gradient of a custom gradient (TF and JAX pass it first, PyTorch by name)."""
    return args[0] if upstream is None else upstream


# -- content scores --------------------------------------------------------------------------


def query_key_scores_reference(queries, keys):
    """`queries @ keys^T`: `(..., T, Dh)` and `(..., K, Dh)` -> `(..., T, K)`."""
    return ops.matmul(queries, ops.swapaxes(keys, -1, -2))


def query_key_scores(queries, keys):
    """`query_key_scores_reference` with the keys' gradient computed transposed,
    `(queries^T @ upstream)^T`: oneDNN's float32 batched product runs that form faster than
    autodiff's `upstream^T @ queries`, whose first operand is a transposed score-sized
    tensor. The queries' gradient is autodiff's `upstream @ keys`."""

    @ops.custom_gradient
    def product(queries, keys):
        def grad(*args, upstream=None):
            upstream = _upstream(args, upstream)
            d_keys = ops.swapaxes(ops.matmul(ops.swapaxes(queries, -1, -2), upstream), -1, -2)
            return ops.matmul(upstream, keys), d_keys

        return query_key_scores_reference(queries, keys), grad

    return product(queries, keys)


# -- softmax and values ----------------------------------------------------------------------


def softmax_values_reference(scores, values):
    """`softmax(scores) @ values` over the keys: float32 scores `(..., T, K)`, values
    `(..., K, Dh)` -> `(..., T, Dh)` of the values' dtype (the probabilities cast to it)."""
    probs = ops.cast(ops.softmax(scores, axis=-1), values.dtype)
    return ops.matmul(probs, values)


def softmax_values(scores, values):
    """`softmax_values_reference` with its gradient written out (training).

    The softmax's gradient `P * (dP - rowsum(dP * P))` needs the row sums of a score-sized
    product; they equal `rowsum(dO * O)` (`dP = dO @ V^T`, `O = P @ V`), a sum over `Dh`
    columns instead of `K`, as in FlashAttention's backward pass: two passes over the
    scores instead of autodiff's four. The values' gradient `P^T @ dO` is computed
    transposed, `(dO^T @ P)^T`, the form oneDNN's batched product runs faster."""
    dtype = values.dtype

    @ops.custom_gradient
    def attend(scores, values):
        probs = ops.softmax(scores, axis=-1)
        weights = ops.cast(probs, dtype)
        attended = ops.matmul(weights, values)

        def grad(*args, upstream=None):
            upstream = _upstream(args, upstream)
            d_values = ops.swapaxes(ops.matmul(ops.swapaxes(upstream, -1, -2), weights), -1, -2)
            d_weights = ops.cast(ops.matmul(upstream, ops.swapaxes(values, -1, -2)), "float32")
            rows = ops.sum(ops.cast(upstream, "float32") * ops.cast(attended, "float32"), axis=-1, keepdims=True)
            return probs * (d_weights - rows), d_values

        return attended, grad

    return attend(scores, values)


def softmax_values_forward(scores, values):
    """`softmax_values_reference` normalised after the product (no gradient needed): the
    row sums divide `(T, Dh)` outputs instead of `(T, K)` probabilities, one pass fewer
    over the scores."""
    weights = ops.exp(scores - ops.max(scores, axis=-1, keepdims=True))
    attended = ops.matmul(ops.cast(weights, values.dtype), values)
    return attended / ops.cast(ops.sum(weights, axis=-1, keepdims=True), attended.dtype)


# -- position scores -------------------------------------------------------------------------


def all_distances(columns, count):
    """Per-distance columns `(..., P)` (distances `P - 1, ..., 0`, the distances past
    `P - 1` sharing column 0) -> `(..., count)`, distances `count - 1, ..., 0`."""
    have = ops.shape(columns)[-1]
    if not isinstance(have, int) or not isinstance(count, int) or have == count:
        return columns
    if have > count:
        return columns[..., have - count:]
    far = ops.broadcast_to(columns[..., :1], tuple(ops.shape(columns)[:-1]) + (count - have,))
    return ops.concatenate([far, columns], axis=-1)


def position_scores_reference(queries, position_keys, key_length, score_bias=None):
    """The paper's position term `(q_i + v)^T W_R R_{i-j}` of every query and key, shifted
    into place: queries `(h, B, T, Dh)` (the bias `v` added), `position_keys` `(h, Dh, P)`,
    optional `score_bias` `(h, P)` (attn_type 1's `b`, per distance like the keys) ->
    `(h, B, T, K)`, at `[.., i, j]` the score of distance `M + i - j` (garbage above the
    causal diagonal)."""
    keys = all_distances(position_keys, key_length)  # (h, Dh, K): column c, distance K - 1 - c
    scores = ops.einsum("hbtd,hdk->hbtk", queries, ops.cast(keys, queries.dtype))
    if score_bias is not None:
        scores = scores + ops.cast(all_distances(score_bias, key_length), scores.dtype)[:, None, None, :]
    return relative_shift_reference(scores)


def position_scores(queries, position_keys, key_length, score_bias=None):
    """`position_scores_reference` computed where the distances differ.

    With `P < K` (a clamped encoding) every key further than `P - 1 + i` from query `i`
    has the score of distance `P - 1`, so only the last `width = P - 1 + T` keys are
    scored and shifted (`width + 1` columns, the spare of `relative_shift` in front) and
    the older keys take the score of the first of them. The position product is one
    `(B * T, Dh) x (Dh, width + 1)` product per head, with no score-sized transpose."""
    heads, batch, length, dim = ops.shape(queries)
    count = ops.shape(position_keys)[-1]
    clamped = all(isinstance(n, int) for n in (count, key_length, length)) and count < key_length
    width = min(key_length, count - 1 + length) if clamped else key_length
    extra = width + 1 - count if clamped else 1  # columns in front: the spare, and distances past P - 1

    def front(columns):
        first = columns[..., :1]
        return first if extra == 1 else ops.broadcast_to(first, tuple(ops.shape(columns)[:-1]) + (extra,))

    keys = ops.cast(position_keys, queries.dtype)
    keys = ops.concatenate([front(keys), keys], axis=-1)  # (h, Dh, width + 1): column c, distance width - c
    scores = ops.matmul(ops.reshape(queries, (heads, -1, dim)), keys)
    scores = ops.reshape(scores, (heads, batch, length, -1))
    if score_bias is not None:
        bias = ops.cast(score_bias, scores.dtype)
        scores = scores + ops.concatenate([front(bias), bias], axis=-1)[:, None, None, :]
    scores = relative_shift(scores)  # the last `width` keys
    if not clamped or width == key_length:
        return scores
    # The older keys' column repeated in front (a broadcast select is slow on TensorFlow).
    far = ops.broadcast_to(scores[..., :1], tuple(ops.shape(scores)[:-1]) + (key_length - width,))
    return ops.concatenate([far, scores], axis=-1)


# -- the whole attention ---------------------------------------------------------------------


def relative_attention(queries, keys, values, position_keys=None, content_bias=None, position_bias=None,
                       score_bias=None, mask=None, training=False, probs_dropout=None):
    """The fast path of `RelativeAttention.attention`, which is its reference: the same
    arguments (heads first, see the module) and result `(h, B, T, Dh)`.

    The `1/sqrt(Dh)` scale is applied to the queries (fewer values than the scores); in
    training the score products and the softmax have their gradients written out
    (`query_key_scores`, `softmax_values`, unless `probs_dropout` drops probabilities);
    outside training the softmax is normalised after its product with the values;
    position scores are computed only for distinct distances (`position_scores`).
    `probs_dropout`: a callable applied to the probabilities in training, or None."""
    dtype = keras.backend.standardize_dtype(queries.dtype)
    scale = ops.cast(1.0 / ops.shape(queries)[-1] ** 0.5, dtype)
    q = queries * scale
    content_q = q if content_bias is None else q + scale * ops.cast(content_bias, dtype)[:, None, None]
    scores = (query_key_scores if training else query_key_scores_reference)(content_q, keys)
    if position_keys is not None:
        position_q = q if position_bias is None else q + scale * ops.cast(position_bias, dtype)[:, None, None]
        bias = None if score_bias is None else scale * ops.cast(score_bias, dtype)
        scores = scores + position_scores(position_q, position_keys, ops.shape(keys)[2], bias)
    scores = ops.cast(scores, "float32")
    if mask is not None:  # an additive bias: its gradient is free
        scores = scores + ops.where(mask, 0.0, MASK_VALUE)
    if not training:
        return softmax_values_forward(scores, values)
    if probs_dropout is None:
        return softmax_values(scores, values)
    probs = ops.cast(ops.softmax(scores, axis=-1), dtype)
    return ops.matmul(probs_dropout(probs), values)


# -- attention to a ring buffer in place ------------------------------------------------------


def ring_relative_attention(queries, ring_keys, ring_values, offset, memory_length, keys, values,
                            position_keys=None, content_bias=None, position_bias=None, score_bias=None, mask=None,
                            written=None):
    """`relative_attention` outside training with the memory's keys and values left in their
    ring `(h, B, capacity, Dh)` (the oldest row at slot `offset`), where the reference joins
    the ring's last `memory_length` rows in time order to the segment's `keys` and `values`
    `(h, B, T, Dh)` (a copy of the whole memory). Here the scores `(h, B, T, capacity)` are
    put in time order and the weights back in slot order: cheaper than moving the memory
    for one query per row (a generation step); the same result up to the order of the sum
    over the memory.

    `written`: optional int32 scalar, how many of the newest slots were written; every
    older slot holds one same row (the initial memory's). On TensorFlow, when the written
    slots lie just before `offset` (a ring that has not filled yet, `InferenceCache.turned`),
    only they and one older slot are read: a step costs what was written, not the capacity."""
    dtype = keras.backend.standardize_dtype(queries.dtype)
    scale = ops.cast(1.0 / ops.shape(queries)[-1] ** 0.5, dtype)
    q = queries * scale
    content_q = q if content_bias is None else q + scale * ops.cast(content_bias, dtype)[:, None, None]

    def attend(memory_scores, weigh_memory):
        # memory_scores (h, B, T, memory_length) in time order; weigh_memory(weights) -> (h, B, T, Dh)
        scores = ops.concatenate([memory_scores, query_key_scores_reference(content_q, keys)], axis=-1)
        if position_keys is not None:
            position_q = q if position_bias is None else q + scale * ops.cast(position_bias, dtype)[:, None, None]
            bias = None if score_bias is None else scale * ops.cast(score_bias, dtype)
            scores = scores + position_scores(position_q, position_keys, memory_length + ops.shape(keys)[2], bias)
        scores = ops.cast(scores, "float32")
        if mask is not None:
            scores = scores + ops.where(mask, 0.0, MASK_VALUE)
        weights = ops.exp(scores - ops.max(scores, axis=-1, keepdims=True))
        attended = weigh_memory(weights[..., :memory_length]) \
            + ops.matmul(ops.cast(weights[..., memory_length:], dtype), values)
        return attended / ops.cast(ops.sum(weights, axis=-1, keepdims=True), attended.dtype)

    whole_ring = lambda: attend(*_whole_ring(content_q, ring_keys, ring_values, offset, memory_length))  # noqa: E731
    if written is None or not memory_length or keras.config.backend() != "tensorflow":  # XLA: static shapes
        return whole_ring()
    import tensorflow as tf

    live = tf.minimum(tf.cast(written, "int32"), memory_length)  # the written rows of the memory
    return tf.cond(tf.logical_and(offset >= live, written < ops.shape(ring_keys)[2]),
                   lambda: attend(*_written_slots(content_q, ring_keys, ring_values, offset, memory_length, live)),
                   whole_ring)


def _whole_ring(content_q, ring_keys, ring_values, offset, memory_length):
    """`(memory scores (h, B, T, memory_length) in time order, weigh)` of every slot of the
    ring, `weigh(weights in time order)` -> `(h, B, T, Dh)`."""
    dtype = keras.backend.standardize_dtype(content_q.dtype)
    capacity = ops.shape(ring_keys)[2]
    in_slots = query_key_scores_reference(content_q, ops.cast(ring_keys, dtype))

    def weigh(weights):
        in_slots = ops.cast(weights, ring_values.dtype)
        older = capacity - memory_length  # slots outside the memory: no weight
        if older:
            in_slots = ops.pad(in_slots, [[0, 0], [0, 0], [0, 0], [older, 0]])
        return ops.matmul(ops.roll(in_slots, offset, axis=-1), ops.cast(ring_values, dtype))

    return ops.roll(in_slots, -offset, axis=-1)[..., capacity - memory_length:], weigh


def _written_slots(content_q, ring_keys, ring_values, offset, memory_length, live):
    """`_whole_ring` of a ring whose `live` written rows lie in slots `[offset - live,
    offset)` and whose other slots hold one initial row, read at slot `offset` (TensorFlow:
    a slice of a size known when it runs). The initial row's score stands for the
    `memory_length - live` oldest rows, and their weights are summed onto its value."""
    import tensorflow as tf

    dtype = keras.backend.standardize_dtype(content_q.dtype)
    heads, batch, length = tf.unstack(tf.shape(content_q)[:3])
    start, count = [0, 0, offset - live, 0], tf.stack([heads, batch, live + 1, tf.shape(ring_keys)[3]])
    slots_v = ops.cast(tf.slice(ring_values, start, count), dtype)
    scores = query_key_scores_reference(content_q, ops.cast(tf.slice(ring_keys, start, count), dtype))
    initial = tf.broadcast_to(scores[..., live:], tf.stack([heads, batch, length, memory_length - live]))

    def weigh(weights):
        older, newer = weights[..., :memory_length - live], weights[..., memory_length - live:]
        weights = tf.concat([newer, tf.reduce_sum(older, axis=-1, keepdims=True)], axis=-1)
        return ops.matmul(ops.cast(weights, dtype), slots_v)

    return tf.concat([initial, scores[..., :live]], axis=-1), weigh
