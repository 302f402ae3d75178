"""Transformer-XL multi-head attention over [memory, segment] with relative positions."""

import keras
from keras import ops

from txl_keras.layers.key_value_memory import ring_rows
from txl_keras.layers.layer_norm import LayerNorm
from txl_keras.layers.relative_shift import relative_shift
from txl_keras.layers.replica_dropout import ReplicaDropout
from txl_keras.layers.weight_initializers import weight_initializer

# Added to blocked scores in float32; softmax always runs in float32, so this neither
# overflows in float16/bfloat16 nor lets a blocked key through.
MASK_VALUE = -1e30
# Outside training, the heads' scores are computed in groups of at most this many bytes.
SCORE_BYTES = 32 << 20


@keras.saving.register_keras_serializable(package="txl_keras")
class RelativeAttention(keras.layers.Layer):
    """Relative multi-head attention of Transformer-XL, with residual and layer norm.

    The segment `h` attends to `concat([memory, h])`. One fused bias-free projection
    gives queries (current rows only), keys and values. The score of query `i` and key
    `j` at distance `d = M + i - j` is

        (q_i + u) . k_j  +  rel_shift((q_i + v) . r_d)  (+ b_d)

    scaled by `1/sqrt(head_dim)`, masked, soft-maxed in float32 over keys (then
    `attention_dropout`). `u` and `v` are the global content and position biases
    (`r_w_bias`, `r_r_bias`), passed in because the model shares them across layers
    unless `untie_r`. With `position_projection=True` (attn_type 0) the sinusoid
    encoding is projected by a bias-free `r` kernel; with `False` (attn_type 1, Shaw et
    al.) the caller passes learned per-head position keys `r` and a score bias `b`.
    Without `position_encoding` it is plain causal attention (attn_type 2 and 3, whose
    positions are added to the inputs). The output is projected without bias,
    dropped out and added to the input; post-norm applies layer norm to the sum,
    `pre_lnorm` normalises `[memory, h]` before the projection instead.

    With `clamp_len`, every distance from `clamp_len` on shares one position key (the
    paper's evaluations: clamp_len 1,000 against 1,728 keys at wt103's, 3,928 at
    enwik8's). A query's keys at distance `clamp_len` or more then all get one position
    score, so only the last `clamp_len + T` keys need the relative shift: the position
    product has `clamp_len + T + 1` columns instead of `K + 1` (exact; 35% of it saved at
    wt103's settings, 71% at enwik8's), and the keys further back take the score of the
    first of them.

    In training without `attention_dropout` the product of the probabilities with the
    values has its gradient written out (`weighted_values`: two passes over the scores
    where autodiff's softmax gradient makes four), and in training the content scores'
    keys' gradient is computed transposed (`query_key_scores`).

    Outside training, the heads' scores are computed in groups of at most `SCORE_BYTES`
    (32 MB), one group after the other: the same values, without the several score-sized
    temporaries of all heads at once (71 MB each at wt103's evaluation at batch 8).

    Because positions enter only through `r`, the keys and values of a memory row do
    not change from one segment to the next: with frozen weights (evaluation,
    generation) the caller can keep them (`project_kv`) and pass `context_kv` instead
    of recomputing the projection of the whole memory every segment (section 3.3).

    Args:
        num_heads: int, `H`.
        head_dim: int, `Dh`.
        dropout: float, dropout on the attention output.
        attention_dropout: float, dropout on the attention probabilities (`dropatt`).
        position_projection: bool, project a `(K, hidden_dim)` sinusoid encoding.
        pre_lnorm: bool, pre-norm instead of the default post-norm.
        layer_norm_epsilon: float.
        kernel_initializer: initializer of the three kernels.
        **kwargs: base layer arguments (`name`, `dtype`).

    Call arguments:
        inputs: `(batch_size, T, hidden_dim)`, the segment.
        memory: optional `(batch_size, M, hidden_dim)`, this layer's memory.
        position_encoding: optional; `(K, hidden_dim)` with `position_projection`,
            else `(K, H, Dh)`; row `c` encodes distance `K - 1 - c`, `K = M + T`.
        content_bias: optional `(H, Dh)`, `u`.
        position_bias: optional `(H, Dh)`, `v`.
        position_score_bias: optional `(K, H)`, `b` (attn_type 1).
        attention_mask: optional boolean `(T, K)`, True where allowed.
        context_kv: optional `(batch_size, K, 2 * H * Dh)`, the keys and values of
            `[memory, inputs]` (`project_kv` of each row), or the same head-major, a
            pair `(keys, values)` of `(H, batch_size, K, Dh)` (`head_major`), the layout
            the scores multiply; `memory` is then not projected.
        memory_ring: optional `(ring, offset)`: the memory's keys and values as one
            head-major ring buffer `(2 * H, batch_size, capacity, Dh)` (the keys' heads
            first) whose oldest row is at slot `offset` (an int32 scalar); its last
            `memory_ring_rows` rows (default: all) in time order come before the
            segment's own keys and values, `context_kv` (then head-major). They are
            joined one head group at a time, never for all heads at once (45 MB per
            layer and part at wt103's evaluation at batch 8).
        memory_ring_rows: optional int, see `memory_ring`.
        queries: optional `(batch_size, T, H * Dh)`, the queries of `inputs` as
            `project_qkv` gives them with the inputs' keys and values (the caller then
            passes those in `context_kv`), not projected again.
        position_keys: optional `(H, Dh, K')`, the projected sinusoid encoding of
            distances `K' - 1, ..., 0` (`project_positions`), used instead of projecting
            `position_encoding` (it does not change between segments while the weights
            do not); `K' >= K`, or with `clamp_len` `K' >= min(K, clamp_len + 1)`.
        clamp_len: optional int > 0, the clamp the position encoding (or keys) was made
            with (`PositionalEmbedding`'s): every distance from `clamp_len` on has the
            encoding of `clamp_len`. Only the `clamp_len + 1` distinct rows are then
            projected and scored (the result is the same). Not with
            `position_score_bias`, nor with dropout on an encoding (its rows then differ).
        training: bool, enables dropout.

    Returns:
        `(batch_size, T, hidden_dim)`.

    Example:
    >>> layer = RelativeAttention(num_heads=2, head_dim=4)
    >>> h, mem = keras.random.normal((3, 5, 8)), keras.random.normal((3, 6, 8))
    >>> tuple(layer(h, memory=mem, position_encoding=keras.random.normal((11, 8))).shape)
    (3, 5, 8)

    References:
        Dai et al., "Transformer-XL", ACL 2019, section 3.3 and appendix B.
    """

    def __init__(
        self,
        num_heads,
        head_dim,
        dropout=0.0,
        attention_dropout=0.0,
        position_projection=True,
        pre_lnorm=False,
        layer_norm_epsilon=1e-5,
        kernel_initializer="glorot_uniform",
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.num_heads = num_heads
        self.head_dim = head_dim
        self.dropout = dropout
        self.attention_dropout = attention_dropout
        self.position_projection = position_projection
        self.pre_lnorm = pre_lnorm
        self.layer_norm_epsilon = layer_norm_epsilon
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.output_dropout = ReplicaDropout(dropout, dtype=self.dtype_policy)
        self.probs_dropout = ReplicaDropout(attention_dropout, dtype=self.dtype_policy)
        self.layer_norm = LayerNorm(
            epsilon=layer_norm_epsilon, dtype="float32", name="layer_norm"
        )

    def build(self, inputs_shape, *args, **kwargs):
        hidden_dim = inputs_shape[-1]
        inner = self.num_heads * self.head_dim
        self.qkv_kernel = self.add_weight(
            name="qkv_kernel", shape=(hidden_dim, 3 * inner), initializer=weight_initializer(self.kernel_initializer)
        )
        if self.position_projection:
            self.r_kernel = self.add_weight(
                name="r_kernel", shape=(hidden_dim, inner), initializer=weight_initializer(self.kernel_initializer)
            )
        self.o_kernel = self.add_weight(
            name="o_kernel", shape=(inner, hidden_dim), initializer=weight_initializer(self.kernel_initializer)
        )
        self.layer_norm.build(inputs_shape)
        self.built = True

    def _norm(self, x):
        return ops.cast(self.layer_norm(ops.cast(x, "float32")), self.compute_dtype)

    def _context_rows(self, inputs):
        inputs = ops.cast(inputs, self.compute_dtype)
        return self._norm(inputs) if self.pre_lnorm else inputs

    def project_kv(self, inputs):
        """Keys and values of rows `(batch_size, L, hidden_dim)` -> `(batch_size, L, 2 * H * Dh)`
        (keys first), as the call computes them."""
        inner = self.num_heads * self.head_dim
        return ops.matmul(self._context_rows(inputs), ops.split(self.qkv_kernel, [inner], axis=1)[1])

    def project_qkv(self, inputs):
        """Queries `(batch_size, L, H * Dh)` and keys and values `(batch_size, L, 2 * H *
        Dh)` of rows `(batch_size, L, hidden_dim)`, in one product with the whole kernel
        (the call's `queries` and `project_kv`'s rows: with cached keys and values each
        segment projects all three, where two products took the kernel's two parts, which
        XLA copied out of it every call)."""
        qkv = ops.matmul(self._context_rows(inputs), self.qkv_kernel)
        return tuple(ops.split(qkv, [self.num_heads * self.head_dim], axis=-1))

    def project_positions(self, position_encoding):
        """The position keys `(H, Dh, K)` of a sinusoid encoding `(K, hidden_dim)`, column
        `c` from row `c`: head-major, the layout the position scores multiply, so that
        keys projected once (`position_keys`) are not transposed again every call."""
        encoding = ops.cast(position_encoding, self.compute_dtype)
        # (K, H * Dh), transposed after the product: XLA:CPU compiled the product of two
        # transposed operands with ~70 MB more compiler and runtime heap for wt103's 16
        # layers; the transpose copies only K * H * Dh values
        keys = ops.transpose(ops.matmul(encoding, self.r_kernel))  # (H * Dh, K)
        return ops.reshape(keys, (self.num_heads, self.head_dim, -1))

    def _position_keys(self, position_encoding, position_keys, key_length, distinct):
        """The last `distinct` position keys, `(H, Dh, distinct)`: distances `distinct - 1`
        down to 0 (projected here from `position_encoding` unless `position_keys`)."""
        given = position_encoding if position_keys is None else position_keys
        if position_keys is not None and tuple(ops.shape(given)[:-1]) != (self.num_heads, self.head_dim):
            raise ValueError(f"Expected `position_keys` of shape (num_heads={self.num_heads}, head_dim="
                             f"{self.head_dim}, K') as project_positions() returns; received shape "
                             f"{tuple(ops.shape(given))}.")
        available = ops.shape(given)[-1 if position_keys is not None else 0]
        if isinstance(available, int) and isinstance(distinct, int) and available < distinct:
            what, unit = ("position_keys", "columns") if position_keys is not None else ("position_encoding", "rows")
            raise ValueError(f"Expected `{what}` to have at least {distinct} {unit} for {key_length} keys; "
                             f"received {available}.")
        if position_keys is not None:
            return ops.cast(given[..., available - distinct:], self.compute_dtype)
        rows = given[available - distinct:]
        if self.position_projection:
            return self.project_positions(rows)
        rows = ops.reshape(ops.cast(rows, self.compute_dtype), (-1, self.num_heads, self.head_dim))
        return ops.transpose(rows, (1, 2, 0))

    def _heads(self, x):
        shape = ops.shape(x)
        return ops.reshape(x, (shape[0], shape[1], self.num_heads, self.head_dim))

    def call(
        self,
        inputs,
        memory=None,
        position_encoding=None,
        content_bias=None,
        position_bias=None,
        position_score_bias=None,
        attention_mask=None,
        context_kv=None,
        position_keys=None,
        clamp_len=None,
        queries=None,
        memory_ring=None,
        memory_ring_rows=None,
        training=False,
    ):
        inner = self.num_heads * self.head_dim
        query_input = self._norm(inputs) if self.pre_lnorm else inputs
        q_kernel, kv_kernel = ops.split(self.qkv_kernel, [inner], axis=1)
        if queries is None:
            queries = ops.matmul(query_input, q_kernel)
        elif tuple(ops.shape(queries)[-1:]) != (inner,) or len(ops.shape(queries)) != 3:
            raise ValueError(f"Expected `queries` of shape (batch_size, T, num_heads * head_dim = {inner}) as "
                             f"project_qkv() returns; received shape {tuple(ops.shape(queries))}.")
        q = self._heads(ops.cast(queries, self.compute_dtype))
        if context_kv is None:
            context_kv = ops.matmul(query_input, kv_kernel)
            if memory is not None:
                # The memory's rows by a product of their own, joined after it: the
                # model's memory carries no gradient, so the backward pass computes only
                # the kernel's gradient of this product, where a product of the joined
                # rows computed the input gradient of all of them (word-level training:
                # ~2% of a step).
                context_kv = ops.concatenate([ops.matmul(self._context_rows(memory), kv_kernel), context_kv], axis=1)
        if isinstance(context_kv, (tuple, list)):  # head-major already
            keys, values = (ops.cast(x, self.compute_dtype) for x in context_kv)
        elif memory_ring is not None:
            raise ValueError("`memory_ring` comes before the segment's own keys and values, which it needs "
                             "head-major: pass `context_kv=(keys, values)` (`head_major`).")
        else:
            keys, values = (ops.transpose(self._heads(x), (2, 0, 1, 3))
                            for x in ops.split(ops.cast(context_kv, self.compute_dtype), 2, axis=-1))

        # Scores are laid out (heads, batch, T, K): the position scores, shared across the
        # batch, are then one (batch * T, Dh) x (Dh, K + 1) product per head, written in
        # place, with no transpose of a score-sized tensor anywhere.
        # The 1/sqrt(head_dim) scale is applied to the queries (cheaper than to the scores).
        scale = ops.cast(1.0 / self.head_dim**0.5, q.dtype)
        q = ops.transpose(q, (2, 0, 1, 3)) * scale  # (H, B, T, Dh)
        batch, query_length = ops.shape(q)[1], ops.shape(q)[2]
        key_length = ops.shape(keys)[2]  # keys and values (H, B, K, Dh)
        if memory_ring is not None:
            if memory_ring_rows is None:
                memory_ring_rows = ops.shape(memory_ring[0])[2]
            key_length = memory_ring_rows + key_length
        content_q = q if content_bias is None else q + scale * ops.cast(content_bias, q.dtype)[:, None, None]
        position = None
        if position_keys is not None or position_encoding is not None:
            if clamp_len is not None and position_score_bias is not None:
                raise ValueError("`clamp_len` applies to a sinusoid encoding (attn_type 0), not with "
                                 "`position_score_bias` (attn_type 1).")
            window = _clamped_window(key_length, query_length, clamp_len)
            width, distinct = window or (key_length, key_length)
            r = self._position_keys(position_encoding, position_keys, key_length, distinct)
            # Column c encodes distance width - c: the spare column in front (distance
            # width, see relative_shift) and, with clamping, every distance past clamp_len.
            front = r[..., :1] if window is None else ops.broadcast_to(
                r[..., :1], (self.num_heads, self.head_dim, width + 1 - distinct))
            r = ops.concatenate([front, r], axis=-1)  # (H, Dh, width + 1)
            position_q = q if position_bias is None else q + scale * ops.cast(position_bias, q.dtype)[:, None, None]
            bias = None
            if position_score_bias is not None:
                bias = ops.cast(position_score_bias, q.dtype)
                bias = scale * ops.transpose(ops.concatenate([bias[:1], bias], axis=0))  # (H, width + 1)
            position = (position_q, r, bias, width)
        mask = None if attention_mask is None else ops.where(attention_mask, 0.0, MASK_VALUE)[None, None]

        # Outside training the heads go in groups whose scores take at most SCORE_BYTES,
        # one group after the other (a loop, so that the groups' scores cannot be live at
        # once): the same values in a fraction of the memory at long memory (wt103's
        # evaluation at batch 8: 71 MB per score tensor of all heads).
        group = self.num_heads if training else _head_group(self.num_heads, batch, query_length, key_length)
        count = self.num_heads // group
        # Each group's queries, keys, values and position tensors, then (with a ring) its index.
        parts = [content_q, keys, values] + ([] if position is None else [x for x in position[:3] if x is not None])

        def attend(parts):
            group_keys, group_values = parts[1], parts[2]
            if memory_ring is not None:
                first, parts = parts[-1] * group, parts[:-1]
                group_keys = self._joined(memory_ring, memory_ring_rows, first, group_keys)
                group_values = self._joined(memory_ring, memory_ring_rows, first + self.num_heads, group_values)
            group_position = None
            if position is not None:
                bias = parts[5] if len(parts) > 5 else None
                group_position = (parts[3], parts[4], bias, position[3])
            return self._attend(parts[0], group_keys, group_values, mask, group_position, training)

        if group == self.num_heads:
            attended = attend(parts + ([] if memory_ring is None else [0]))
        else:

            def grouped(x):
                return ops.reshape(x, (count, group) + tuple(ops.shape(x)[1:]))

            index = [] if memory_ring is None else [ops.arange(count, dtype="int32")]
            attended = ops.map(attend, tuple([grouped(x) for x in parts] + index))  # (count, group, B, T, Dh)
            attended = ops.reshape(attended, (self.num_heads,) + tuple(ops.shape(attended)[2:]))
        attended = ops.reshape(ops.transpose(attended, (1, 2, 0, 3)), (batch, query_length, inner))
        output = self.output_dropout(ops.matmul(attended, self.o_kernel), training=training)
        if self.pre_lnorm:
            return inputs + output
        return self._norm(inputs + output)

    def _joined(self, memory_ring, rows, first, segment):
        """Heads `first, ...` of the ring in time order, then the segment's `(h, B, T, Dh)`:
        `(h, B, rows + T, Dh)`; the heads' slice, the ring's rotation and the joining
        are one copy (XLA fuses them)."""
        ring, offset = memory_ring
        part = ops.slice(ring, [first, 0, 0, 0], (ops.shape(segment)[0],) + tuple(ops.shape(ring)[1:]))
        return ops.concatenate([ops.cast(ring_rows(part, offset, rows), self.compute_dtype), segment], axis=2)

    def _attend(self, content_q, keys, values, mask, position, training):
        """Attention of some heads `h`: queries `(h, B, T, Dh)`, keys `(h, B, K, Dh)`,
        values `(h, B, K, Dh)`, `position` None or `(position queries (h, B, T, Dh),
        position keys (h, Dh, width + 1), score bias (h, width + 1) or None, width)` ->
        `(h, B, T, Dh)`."""
        heads, batch, query_length = ops.shape(content_q)[0], ops.shape(content_q)[1], ops.shape(content_q)[2]
        key_length = ops.shape(keys)[2]
        # (h, B, T, K); the transpose is the product's operand order, not a copy (XLA and
        # TensorFlow's graph optimizer fold it into the product).
        scores = query_key_scores(content_q, keys) if training else ops.matmul(content_q, ops.swapaxes(keys, -1, -2))
        if position is not None:
            position_q, r, bias, width = position
            position_q = ops.reshape(position_q, (heads, -1, self.head_dim))
            position_scores = ops.matmul(position_q, r)  # (h, B * T, width + 1)
            position_scores = ops.reshape(position_scores, (heads, batch, query_length, -1))
            if bias is not None:
                position_scores = position_scores + bias[:, None, None, :]
            position_scores = relative_shift(position_scores)  # the last `width` keys
            if isinstance(width, int) and isinstance(key_length, int) and width < key_length:
                # Every older key is at distance clamp_len or more: the score of the first
                # shifted key (its distance is clamp_len + i) is theirs too. Padded in front
                # and selected: XLA fuses both into the scores' sum, where it wrote the
                # broadcast and their concatenation as two more score-sized tensors.
                far = key_length - width
                padded = ops.pad(position_scores, [[0, 0], [0, 0], [0, 0], [far, 0]])
                position_scores = ops.where(ops.arange(key_length) < far, position_scores[..., :1], padded)
            scores = scores + position_scores

        scores = ops.cast(scores, "float32")
        if mask is not None:  # an additive bias: its gradient is free
            scores = scores + mask
        if training and self.attention_dropout == 0:
            return weighted_values(scores, values, self.compute_dtype)
        if training:
            probs = ops.cast(ops.softmax(scores, axis=-1), self.compute_dtype)
            return ops.matmul(self.probs_dropout(probs, training=training), values)
        # Normalised after the product with the values: the sum divides (T, Dh) outputs
        # instead of (T, K) probabilities, one pass fewer over the scores (in training
        # the backward pass then costs more than it saves).
        weights = ops.exp(scores - ops.max(scores, axis=-1, keepdims=True))
        attended = ops.matmul(ops.cast(weights, self.compute_dtype), values)
        return attended / ops.cast(ops.sum(weights, axis=-1, keepdims=True), attended.dtype)

    def compute_output_shape(self, inputs_shape, *args, **kwargs):
        return inputs_shape

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "num_heads": self.num_heads,
                "head_dim": self.head_dim,
                "dropout": self.dropout,
                "attention_dropout": self.attention_dropout,
                "position_projection": self.position_projection,
                "pre_lnorm": self.pre_lnorm,
                "layer_norm_epsilon": self.layer_norm_epsilon,
                "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
            }
        )
        return config


def weighted_values(scores, values, dtype):
    """`softmax(scores) @ values` with its gradient written out: float32 scores `(..., T,
    K)`, values `(..., K, Dh)` of `dtype` -> `(..., T, Dh)` of `dtype` (the probabilities
    cast to `dtype` for the product, as autodiff's version).

    The softmax's gradient `P * (dP - rowsum(dP * P))` needs the row sums of a
    score-sized product; they equal `rowsum(dO * O)` (`dP = dO @ V^T`, `O = P @ V`), a
    sum over `Dh` columns instead of `K` (as FlashAttention's backward pass): two passes
    over the scores instead of four (word-level training: ~3% of a step). The values'
    gradient `P^T @ dO` is computed transposed, `(dO^T @ P)^T`: oneDNN's batched product
    with the probabilities' transpose as its first operand ran at ~100 GFLOP/s where this
    one runs at ~145 (a transpose of `(..., K, Dh)` added)."""

    @ops.custom_gradient
    def attend(scores, values):
        probs = ops.softmax(scores, axis=-1)
        weights = ops.cast(probs, dtype)
        attended = ops.matmul(weights, values)

        def grad(*args, upstream=None):  # (TF and JAX pass `upstream` first, PyTorch by name)
            upstream = args[0] if upstream is None else upstream
            d_values = ops.swapaxes(ops.matmul(ops.swapaxes(upstream, -1, -2), weights), -1, -2)
            d_weights = ops.cast(ops.matmul(upstream, ops.swapaxes(values, -1, -2)), "float32")
            rows = ops.sum(ops.cast(upstream, "float32") * ops.cast(attended, "float32"), axis=-1, keepdims=True)
            return probs * (d_weights - rows), d_values

        return attended, grad

    return attend(scores, values)


def query_key_scores(queries, keys):
    """`queries @ keys^T` with its gradient written out: `(..., T, Dh)` and `(..., K, Dh)`
    -> `(..., T, K)`.

    Autodiff takes the keys' gradient as `upstream^T @ queries`, a batched product whose
    first operand is a transposed score-sized tensor; this one computes it transposed,
    `(queries^T @ upstream)^T`, which oneDNN's float32 batched product runs 15-35% faster
    at training's shapes (a `(..., Dh, K)` transpose added). The queries' gradient is
    autodiff's `upstream @ keys`. Word-level training: 0.992-0.997 of the time per step
    (three in-process A/B runs); character-level 0.984."""

    @ops.custom_gradient
    def product(queries, keys):
        def grad(*args, upstream=None):  # (TF and JAX pass `upstream` first, PyTorch by name)
            upstream = args[0] if upstream is None else upstream
            d_keys = ops.swapaxes(ops.matmul(ops.swapaxes(queries, -1, -2), upstream), -1, -2)
            return ops.matmul(upstream, keys), d_keys

        return ops.matmul(queries, ops.swapaxes(keys, -1, -2)), grad

    return product(queries, keys)


def _head_group(num_heads, batch, query_length, key_length):
    """Heads per group outside training: the largest divisor of `num_heads` whose float32
    scores `(heads, batch, T, K)` fit in SCORE_BYTES (all heads when a size is unknown)."""
    sizes = (batch, query_length, key_length)
    if not all(isinstance(n, int) for n in sizes):
        return num_heads
    per_head = 4 * batch * query_length * key_length
    return max([d for d in range(1, num_heads + 1) if num_heads % d == 0 and d * per_head <= SCORE_BYTES] or [1])


def distinct_distances(key_length, clamp_len):
    """How many distinct position keys `key_length` keys have: one per distance, those
    from `clamp_len` on sharing one (`clamp_len` None or <= 0: no clamp)."""
    return min(key_length, clamp_len + 1) if clamp_len is not None and clamp_len > 0 else key_length


def _clamped_window(key_length, query_length, clamp_len):
    """With `clamp_len` and static lengths, `(width, distinct)`: the last `width =
    min(K, clamp_len + T)` keys are relative-shifted, over `distinct_distances` distances;
    else None (all `K` keys, `K` distances)."""
    if clamp_len is None:
        return None
    if not isinstance(clamp_len, int) or clamp_len <= 0:  # checked whatever the shapes
        raise ValueError(f"Expected `clamp_len` to be a positive integer or None. Received: clamp_len={clamp_len!r}")
    if not isinstance(key_length, int) or not isinstance(query_length, int):
        return None
    return min(key_length, clamp_len + query_length), distinct_distances(key_length, clamp_len)
