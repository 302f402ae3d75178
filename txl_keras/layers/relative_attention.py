"""Transformer-XL multi-head attention over [memory, segment] with relative positions."""

import keras
from keras import ops

from txl_keras import kernels
from txl_keras.kernels.attention import MASK_VALUE, position_scores_reference
from txl_keras.layers import arguments, lora, quantization
from txl_keras.layers.inference_cache import head_major
from txl_keras.layers.layer_norm import LayerNorm
from txl_keras.layers.replica_dropout import ReplicaDropout
from txl_keras.layers.weight_initializers import weight_initializer

# Outside training, the heads' scores are computed in groups of at most this many bytes.
SCORE_BYTES = 32 << 20


@keras.saving.register_keras_serializable(package="txl_keras")
class RelativeAttention(quantization.QuantizableLayer, keras.layers.Layer):
    """Relative multi-head attention of Transformer-XL, with residual and layer norm.

    The segment `h` attends to `concat([memory, h])`. One fused bias-free projection
    gives queries (segment rows only), keys and values. The score of query `i` and key
    `j` at distance `d = M + i - j` is

        (q_i + u) . k_j  +  (q_i + v) . W_R R_d  (+ b_d)

    scaled by `1/sqrt(head_dim)`, masked, soft-maxed in float32 over the keys, dropped
    out (`attention_dropout`) and applied to the values (`attention`). `u` and `v` are
    the global content and position biases (`r_w_bias`, `r_r_bias`), passed in because
    the model shares them across layers unless `untie_r`. A sinusoid encoding `R`
    `(K, hidden_dim)` is projected by a bias-free `W_R` (`r_kernel`, attn_type 0);
    learned per-head position keys `(K, H, Dh)` and a score bias `b` (attn_type 1, Shaw
    et al.) are used as they are. Without `position_encoding` it is plain causal attention
    (attn_type 2 and 3, whose positions are added to the inputs). The layer builds
    `r_kernel` only when it projects: `position_projection=None` (the default) decides by
    the first call's `position_encoding`. The heads are projected without bias (`o_kernel`),
    dropped out and added to the input; post-norm applies layer norm to the sum,
    `pre_lnorm` normalises `[memory, h]` before the projection instead.

    `enable_lora(rank)` adapts the query, key, value and output projections (`qkv_kernel`,
    `o_kernel`) with low-rank adapters and freezes every other weight of the layer
    (`txl_keras.layers.lora`); `merge_lora()` folds them into the kernels. `quantize("int8")`
    turns the three kernels into int8 values with per-column scales (`qkv_kernel_scale`, ...;
    `txl_keras.layers.quantization`).

    `call` is the whole computation; `call_with_cache` is the same for frozen weights
    (evaluation, generation), where the memory is held as its keys and values
    (`InferenceCache`): positions enter only through `W_R R`, so a memory row's keys and
    values do not change from one segment to the next.

    Args:
        num_heads: int, `H`.
        head_dim: int, `Dh`.
        dropout: float in [0, 1), dropout on the attention output.
        attention_dropout: float in [0, 1), dropout on the probabilities (`dropatt`).
        position_projection: None, True or False: whether the calls pass a `(K,
            hidden_dim)` sinusoid encoding to project (True: `r_kernel` is built) or
            not (False: learned keys or no positions); None: as the first call does.
        pre_lnorm: bool, pre-norm instead of the default post-norm.
        layer_norm_epsilon: float.
        kernel_initializer: initializer of the kernels.
        lora_rank: None, or the rank of the adapters `build` adds (`enable_lora`).
        lora_alpha: None (= lora_rank) or a positive number: the adapters' scale is
            `lora_alpha / lora_rank`.
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
        clamp_len: optional int > 0, the clamp the sinusoid encoding was made with
            (`PositionalEmbedding`'s): the fast kernels then project and score only the
            `clamp_len + 1` distinct distances (the result is the same). Not with
            `position_score_bias`, nor with dropout on the encoding.
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
        position_projection=None,
        pre_lnorm=False,
        layer_norm_epsilon=1e-5,
        kernel_initializer="glorot_uniform",
        lora_rank=None,
        lora_alpha=None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        layer = type(self).__name__
        self.num_heads = arguments.positive_int(layer, "num_heads", num_heads)
        self.head_dim = arguments.positive_int(layer, "head_dim", head_dim)
        self.dropout = arguments.rate(layer, "dropout", dropout)
        self.attention_dropout = arguments.rate(layer, "attention_dropout", attention_dropout)
        self.position_projection = arguments.boolean(layer, "position_projection", position_projection,
                                                     allow_none=True)
        self.pre_lnorm = arguments.boolean(layer, "pre_lnorm", pre_lnorm)
        self.layer_norm_epsilon = arguments.positive_float(layer, "layer_norm_epsilon", layer_norm_epsilon)
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.output_dropout = ReplicaDropout(dropout, dtype=self.float_policy)
        self.probs_dropout = ReplicaDropout(attention_dropout, dtype=self.float_policy)
        self.layer_norm = LayerNorm(epsilon=layer_norm_epsilon, dtype="float32", name="layer_norm")
        if lora_rank is not None:
            arguments.positive_int(layer, "lora_rank", lora_rank)
        self.lora_rank, self.lora_alpha = lora_rank, lora_alpha
        self._adapters = {}  # kernel name -> (A, B) once LoRA is enabled

    def build(self, inputs_shape, position_encoding_shape=None):
        hidden_dim = inputs_shape[-1]
        inner = self.num_heads * self.head_dim
        if self.position_projection is None:  # a (K, hidden_dim) sinusoid encoding is projected
            self.position_projection = position_encoding_shape is not None and len(position_encoding_shape) == 2

        def kernel(name, shape):
            return self.add_weight(name=name, shape=shape, initializer=weight_initializer(self.kernel_initializer))

        self.qkv_kernel = kernel("qkv_kernel", (hidden_dim, 3 * inner))
        if self.position_projection:
            self.r_kernel = kernel("r_kernel", (hidden_dim, inner))
        self.o_kernel = kernel("o_kernel", (inner, hidden_dim))
        self.layer_norm.build(inputs_shape)
        self.built = True
        if self.lora_rank is not None:
            self.enable_lora(self.lora_rank, self.lora_alpha)
        self._quantize_if_policy_says()

    # -- low-rank adapters -----------------------------------------------------------------

    @property
    def lora_enabled(self):
        return bool(self._adapters)

    def enable_lora(self, rank, lora_alpha=None, a_initializer="he_uniform", b_initializer="zeros"):
        """Adapt `qkv_kernel` and `o_kernel` with rank-`rank` adapters (`qkv_lora_a`,
        `qkv_lora_b`, `o_lora_a`, `o_lora_b`, float32, B zero) and freeze the layer's other
        weights. Once per layer, after it is built."""
        layer = type(self).__name__
        if not self.built:
            raise ValueError(f"{layer}: build the layer (call it once) before enable_lora().")
        if self.lora_enabled:
            raise ValueError(f"{layer}: LoRA is already enabled (rank {self.lora_rank}); it is enabled once per "
                             "layer (merge_lora() first to start new adapters).")
        if self.quantization_mode is not None:
            raise ValueError(f"{layer}: LoRA adapts float kernels; enable it before quantize(), not after.")
        rank, alpha = lora.check_rank(layer, rank, lora_alpha, [self.qkv_kernel.shape, self.o_kernel.shape])
        for weight in self.weights:
            weight.trainable = False
        self._tracker.unlock()
        self._adapters = {name: lora.add_adapter(self, name, getattr(self, f"{name}_kernel"), rank, a_initializer,
                                                 b_initializer) for name in ("qkv", "o")}
        self._tracker.lock()
        self.lora_rank, self.lora_alpha = rank, alpha

    def merge_lora(self):
        """Fold the adapters into `qkv_kernel` and `o_kernel`, remove them and make the
        layer's weights trainable again: the layer computes what it computed with them."""
        if not self.lora_enabled:
            raise ValueError(f"{type(self).__name__}: there are no adapters to merge; enable_lora(rank) first.")
        for name in self._adapters:
            kernel = getattr(self, f"{name}_kernel")
            kernel.assign(lora.adapted(kernel.value, self._adapters[name], self.lora_alpha / self.lora_rank,
                                       kernel.dtype))
        for a, b in self._adapters.values():
            self._untrack_variable(a)
            self._untrack_variable(b)
        self._adapters, self.lora_rank, self.lora_alpha = {}, None, None
        for layer in self._flatten_layers():
            for weight in layer._trainable_variables:  # the weights made trainable
                weight.trainable = True

    def lora_weights(self):
        """The adapters `[qkv A, qkv B, o A, o B]` (empty without LoRA)."""
        return [w for name in ("qkv", "o") if name in self._adapters for w in self._adapters[name]]

    # -- int8 weights ----------------------------------------------------------------------

    def _to_int8(self):
        """`qkv_kernel`, `o_kernel` and `r_kernel` as int8 rows `(out, in)` with a scale per
        output column (`layers.quantization`)."""
        if self.lora_enabled:
            raise ValueError(f"{type(self).__name__}: merge_lora() before quantize(): int8 kernels take no adapters.")
        for name in ("qkv", "o", "r"):
            if hasattr(self, f"{name}_kernel"):
                kernel, scale = quantization.to_int8(self, getattr(self, f"{name}_kernel"), transpose=True)
                setattr(self, f"{name}_kernel", kernel)
                setattr(self, f"{name}_kernel_scale", scale)

    def _weights(self, name):
        """`(kernel, scale)` of `qkv`, `o` or `r` as the layer uses it: a float kernel (with
        its LoRA adapter added) and None, or its int8 rows `(out, in)` and their scale."""
        kernel = getattr(self, f"{name}_kernel")
        if self.quantization_mode == "int8":
            return kernel, getattr(self, f"{name}_kernel_scale")
        if name in self._adapters:
            kernel = lora.adapted(kernel, self._adapters[name], self.lora_alpha / self.lora_rank, self.compute_dtype)
        return kernel, None

    def _qkv_weights(self):
        """`_weights("qkv")` split into the queries' and the keys' and values' columns."""
        kernel, scale = self._weights("qkv")
        inner = self.num_heads * self.head_dim
        if scale is None:
            return tuple((k, None) for k in ops.split(kernel, [inner], axis=1))
        return tuple(zip(ops.split(kernel, [inner], axis=0), ops.split(scale, [inner], axis=0)))

    # -- the paper's computation ---------------------------------------------------------

    def call(self, inputs, memory=None, position_encoding=None, content_bias=None, position_bias=None,
             position_score_bias=None, attention_mask=None, clamp_len=None, training=False):
        q_weights, kv_weights = self._qkv_weights()
        rows = self._rows(inputs)
        queries = self._heads(quantization.matmul(rows, *q_weights))  # (H, B, T, Dh)
        keys_values = quantization.matmul(rows, *kv_weights)
        if memory is not None:
            # The memory's rows by a product of their own: no gradient flows into the memory,
            # so only the kernel's gradient of this product is computed.
            keys_values = ops.concatenate([quantization.matmul(self._rows(memory), *kv_weights), keys_values], axis=1)
        keys, values = (self._heads(x) for x in ops.split(keys_values, 2, axis=-1))  # (H, B, K, Dh) each
        position_keys, score_bias = self._position_keys(position_encoding, position_score_bias,
                                                        ops.shape(keys)[2], clamp_len)
        attended = self.attention(queries, keys, values, position_keys, content_bias, position_bias, score_bias,
                                  attention_mask, training)
        return self._output(inputs, attended, training)

    def attention(self, queries, keys, values, position_keys=None, content_bias=None, position_bias=None,
                  score_bias=None, attention_mask=None, training=False):
        """The attention of some heads `h`, section 3.3 of the paper: for query `i` and
        key `j` at distance `d = M + i - j`,

            A_ij = (q_i + u) . k_j  +  relative_shift((q_i + v) . W_R R)_ij
                   (content, "a + c")   (position, "b + d", plus b_d for attn_type 1)

        scaled by `1/sqrt(Dh)`, masked, soft-maxed over `j` in float32, dropped out in
        training, applied to the values.

        Args:
            queries: `(h, B, T, Dh)`.
            keys, values: `(h, B, K, Dh)`.
            position_keys: optional `(h, Dh, P)`, `W_R R` of distances `P - 1, ..., 0`
                (`P < K` with a clamped encoding: every further distance shares column 0).
            content_bias, position_bias: optional `(h, Dh)`, `u` and `v`.
            score_bias: optional `(h, P)`, `b`.
            attention_mask: optional boolean `(T, K)`, True where allowed.
            training: bool.

        Returns:
            `(h, B, T, Dh)`, each head's attended values.
        """
        if kernels.fast_kernels_enabled():  # the same result, faster (kernels.relative_attention)
            dropout = (lambda p: self.probs_dropout(p, training=True)) if self.attention_dropout else None
            return kernels.relative_attention(queries, keys, values, position_keys, content_bias, position_bias,
                                              score_bias, attention_mask, training, dropout)
        scores = ops.matmul(_plus(queries, content_bias), ops.swapaxes(keys, -1, -2))  # content
        if position_keys is not None:  # position: scored per distance, then shifted to the keys
            scores = scores + position_scores_reference(_plus(queries, position_bias), position_keys,
                                                        ops.shape(keys)[2], score_bias)
        scores = ops.cast(scores, "float32") / self.head_dim**0.5
        if attention_mask is not None:
            scores = ops.where(attention_mask, scores, MASK_VALUE)
        probs = ops.cast(ops.softmax(scores, axis=-1), self.compute_dtype)
        return ops.matmul(self.probs_dropout(probs, training=training), values)

    # -- frozen weights ----------------------------------------------------------------------

    def call_with_cache(self, inputs, cache, layer, memory_length, position_encoding=None, content_bias=None,
                        position_bias=None, position_score_bias=None, attention_mask=None, clamp_len=None):
        """`call` for frozen weights, the memory held as its keys and values.

        Layer `layer`'s memory is the last `memory_length` rows of `cache.rings[layer]`,
        `(2H, batch_size, capacity, Dh)`, keys' heads then values' heads;
        `cache.position_keys[layer]` `(H, Dh, P')` (if any) replaces `position_encoding`
        (only its last `P` columns are used). Outside training the heads go in groups
        whose scores take at most `SCORE_BYTES`, one after another: the same values in a
        fraction of the memory; each group joins its heads of the memory to the segment's,
        or, for a one-token segment (a generation step), attends to the ring where it lies
        (`kernels.ring_relative_attention`: no copy of the memory; longer segments compiled
        for evaluation ran slower that way).

        Returns:
            `(output (batch_size, T, hidden_dim), the segment's keys and values
            (batch_size, T, 2 * H * Dh))`.
        """
        queries, segment = self.project_qkv(inputs)
        key_length = memory_length + ops.shape(inputs)[1]
        stored = cache.position_keys[layer] if cache.position_keys else None
        position_keys, score_bias = self._position_keys(position_encoding, position_score_bias, key_length,
                                                        clamp_len, stored)
        heads = head_major(ops.cast(segment, self.compute_dtype), 2 * self.num_heads)
        parts = dict(queries=self._heads(queries), keys=heads[:self.num_heads], values=heads[self.num_heads:],
                     position_keys=position_keys, content_bias=content_bias, position_bias=position_bias,
                     score_bias=score_bias)
        parts = {name: ops.cast(x, self.compute_dtype) for name, x in parts.items() if x is not None}
        ring = cache.rings[layer]

        length = inputs.shape[1]
        in_place = kernels.fast_kernels_enabled() and memory_length > 0 and length == 1

        def attend(part):
            positions = {name: part.get(name) for name in ("position_keys", "content_bias", "position_bias",
                                                           "score_bias")}
            if in_place:  # the ring read where it lies (kernels.ring_relative_attention)
                count = (ops.shape(part["queries"])[0],) + tuple(ops.shape(ring)[1:])
                ring_keys = ops.slice(ring, [part["first"], 0, 0, 0], count)
                ring_values = ops.slice(ring, [part["first"] + self.num_heads, 0, 0, 0], count)
                return kernels.ring_relative_attention(part["queries"], ring_keys, ring_values, cache.offset,
                                                       memory_length, part["keys"], part["values"],
                                                       mask=attention_mask, written=cache.written,
                                                       **positions)
            keys = self._joined(ring, cache.offset, memory_length, part["first"], part["keys"])
            values = self._joined(ring, cache.offset, memory_length, part["first"] + self.num_heads, part["values"])
            return self.attention(part["queries"], keys, values, attention_mask=attention_mask, **positions)

        group = _head_group(self.num_heads, ops.shape(inputs)[0], ops.shape(inputs)[1], key_length)
        if group == self.num_heads:
            attended = attend({**parts, "first": 0})
        else:
            count = self.num_heads // group
            grouped = {name: ops.reshape(x, (count, group) + tuple(ops.shape(x)[1:])) for name, x in parts.items()}
            grouped["first"] = ops.arange(count, dtype="int32") * group
            attended = ops.map(attend, grouped)  # (count, group, B, T, Dh)
            attended = ops.reshape(attended, (self.num_heads,) + tuple(ops.shape(attended)[2:]))
        return self._output(inputs, attended, False), segment

    def _joined(self, ring, offset, rows, first, segment):
        """Heads `first, ...` of the ring's last `rows` rows in time order, then the
        segment's `(h, B, T, Dh)`: `(h, B, rows + T, Dh)` (one copy: XLA fuses the slice,
        the rotation and the join)."""
        if rows == 0:
            return segment
        part = ops.slice(ring, [first, 0, 0, 0], (ops.shape(segment)[0],) + tuple(ops.shape(ring)[1:]))
        ordered = ops.roll(part, -offset, axis=2)[:, :, ops.shape(ring)[2] - rows:]
        return ops.concatenate([ops.cast(ordered, self.compute_dtype), segment], axis=2)

    # -- pieces ----------------------------------------------------------------------------

    def _rows(self, x):
        """Rows as the projections take them: normalised first with `pre_lnorm`."""
        x = ops.cast(x, self.compute_dtype)
        return ops.cast(self.layer_norm(ops.cast(x, "float32")), self.compute_dtype) if self.pre_lnorm else x

    def _heads(self, x):
        """`(B, L, H * Dh)` -> `(H, B, L, Dh)`."""
        shape = ops.shape(x)
        x = ops.reshape(ops.cast(x, self.compute_dtype), (shape[0], shape[1], self.num_heads, self.head_dim))
        return ops.transpose(x, (2, 0, 1, 3))

    def _output(self, inputs, attended, training):
        """Heads `(H, B, T, Dh)` -> projected, dropped out, added to `inputs` and normalised."""
        shape = ops.shape(attended)
        attended = ops.reshape(ops.transpose(attended, (1, 2, 0, 3)), (shape[1], shape[2], shape[0] * shape[3]))
        output = self.output_dropout(quantization.matmul(attended, *self._weights("o")), training=training)
        if self.pre_lnorm:
            return inputs + output
        return ops.cast(self.layer_norm(ops.cast(inputs + output, "float32")), self.compute_dtype)

    def project_kv(self, inputs):
        """Keys and values of rows `(batch_size, L, hidden_dim)` -> `(batch_size, L, 2 * H
        * Dh)` (keys first), as the call computes them."""
        return quantization.matmul(self._rows(inputs), *self._qkv_weights()[1])

    def project_qkv(self, inputs):
        """Queries `(batch_size, L, H * Dh)` and keys and values `(batch_size, L, 2 * H *
        Dh)` of rows `(batch_size, L, hidden_dim)`, in one product with the whole kernel."""
        qkv = quantization.matmul(self._rows(inputs), *self._weights("qkv"))
        return tuple(ops.split(qkv, [self.num_heads * self.head_dim], axis=-1))

    def project_positions(self, position_encoding):
        """The position keys `W_R R` `(H, Dh, K)` of a sinusoid encoding `(K, hidden_dim)`,
        column `c` from row `c`: the layout the position scores multiply."""
        encoding = ops.cast(position_encoding, self.compute_dtype)
        # (K, H * Dh), transposed after the product (XLA:CPU compiled the product of two
        # transposed operands with more compiler and runtime memory)
        keys = ops.transpose(quantization.matmul(encoding, *self._weights("r")))
        return ops.reshape(keys, (self.num_heads, self.head_dim, -1))

    def _position_keys(self, encoding, score_bias, key_length, clamp_len, stored=None):
        """`(position keys (H, Dh, P) or None, score bias (H, P) or None)` for `key_length`
        keys: from `stored` keys (their last `P` columns) or the encoding's last `P` rows,
        `P` the distinct distances (all `key_length` of them without `clamp_len`, or with
        the fast kernels off)."""
        if clamp_len is not None and (not isinstance(clamp_len, int) or clamp_len <= 0):
            raise ValueError(f"Expected `clamp_len` to be a positive integer or None. Received: clamp_len={clamp_len!r}")
        if clamp_len is not None and score_bias is not None:
            raise ValueError("`clamp_len` applies to a sinusoid encoding (attn_type 0), not with "
                             "`position_score_bias` (attn_type 1).")
        given = encoding if stored is None else stored
        if given is None:
            return None, None
        if stored is not None and tuple(ops.shape(stored)[:-1]) != (self.num_heads, self.head_dim):
            raise ValueError(f"Expected position keys of shape (num_heads={self.num_heads}, head_dim="
                             f"{self.head_dim}, K') as project_positions() returns; received shape "
                             f"{tuple(ops.shape(stored))}.")
        clamped = clamp_len is not None and (kernels.fast_kernels_enabled() or stored is not None)
        count = distinct_distances(key_length, clamp_len if clamped else None)
        available = ops.shape(given)[-1 if stored is not None else 0]
        if isinstance(available, int) and isinstance(count, int) and available < count:
            what, unit = ("position keys", "columns") if stored is not None else ("`position_encoding`", "rows")
            raise ValueError(f"Expected {what} to have at least {count} {unit} for {key_length} keys; "
                             f"received {available}.")
        if stored is not None and clamped and not isinstance(count, int):
            # a length known only when the graph runs: one column per key, every distance
            # from clamp_len on taking the stored keys' first column (`position_scores` then
            # scores all of them)
            columns = ops.maximum(ops.arange(key_length) + (available - key_length), 0)
            return ops.cast(ops.take(stored, columns, axis=-1), self.compute_dtype), None
        if stored is not None:
            return ops.cast(stored[..., available - count:], self.compute_dtype), None
        rows = encoding[available - count:]
        if len(ops.shape(rows)) != (2 if self.position_projection else 3):
            raise ValueError(self._encoding_error(ops.shape(encoding)))
        if self.position_projection:
            keys = self.project_positions(rows)
        else:  # learned per-head keys, (K, H, Dh)
            keys = ops.transpose(ops.reshape(ops.cast(rows, self.compute_dtype), (-1, self.num_heads, self.head_dim)),
                                 (1, 2, 0))
        bias = None if score_bias is None else ops.transpose(ops.cast(score_bias, self.compute_dtype))
        return keys, bias

    def _encoding_error(self, shape):
        if self.position_projection:
            return (f"This layer projects a sinusoid encoding of shape (K, hidden_dim); received "
                    f"`position_encoding` of shape {tuple(shape)}.")
        return (f"This layer was built without a position projection (position_projection=False, or its first "
                f"call passed no `position_encoding`): it takes learned keys of shape (K, num_heads={self.num_heads}"
                f", head_dim={self.head_dim}); received shape {tuple(shape)}. Create it with "
                "position_projection=True to project a sinusoid encoding.")

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
                "lora_rank": self.lora_rank,
                "lora_alpha": self.lora_alpha,
            }
        )
        return config


def _plus(x, bias):
    """Heads `(h, B, T, Dh)` plus a per-head bias `(h, Dh)` (or none)."""
    return x if bias is None else x + ops.cast(bias, x.dtype)[:, None, None]


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
    if clamp_len is None or clamp_len <= 0 or not isinstance(key_length, int):
        return key_length
    return min(key_length, clamp_len + 1)
