"""`TransformerXL`: the backbone that maps token ids and memory to hidden states."""

import keras
import numpy as np
from keras import ops

from txl_keras.layers.adaptive_embedding import AdaptiveEmbedding
from txl_keras.layers.attention_mask import causal_attention_mask
from txl_keras.layers.key_value_memory import head_major
from txl_keras.layers.memory_cache import MemoryCache
from txl_keras.layers.positional_embedding import PositionalEmbedding, relative_positions
from txl_keras.layers.relative_attention import distinct_distances
from txl_keras.layers.replica_dropout import ReplicaDropout
from txl_keras.layers.transformer_xl_block import TransformerXLBlock
from txl_keras.layers.weight_initializers import weight_initializer
from txl_keras.models.config import TransformerXLConfig


def initializers(config):
    """`(main, projection)` initializers of a config (`init`, `init_std`, ...)."""
    if config.init == "uniform":
        uniform = keras.initializers.RandomUniform(-config.init_range, config.init_range)
        return uniform, uniform
    return (
        keras.initializers.RandomNormal(0.0, config.init_std),
        keras.initializers.RandomNormal(0.0, config.proj_init_std),
    )


def as_config(config):
    if isinstance(config, TransformerXLConfig):
        return config
    if isinstance(config, dict):
        return TransformerXLConfig.from_dict(config)
    raise TypeError(
        f"Expected a TransformerXLConfig or a dict of its fields. Received: {type(config).__name__}"
    )


@keras.saving.register_keras_serializable(package="txl_keras")
class TransformerXL(keras.Model):
    """Transformer-XL backbone: token ids (and memory) -> hidden states (and memory).

    Adaptive input embedding scaled by `sqrt(d_model)`, dropout, `n_layer`
    `TransformerXLBlock`s attending to their memory, dropout. Positions follow
    `config.attn_type` (0: the paper's relative encoding with global biases `u`, `v`
    shared across layers unless `untie_r`; 1: learned relative; 2: absolute sinusoid;
    3: learned absolute per layer). Each layer's memory is the input it saw over the
    last `mem_len` positions (`MemoryCache`).

    Args:
        config: `TransformerXLConfig` (or a dict of its fields).
        stateful: bool, keep the memory in variables across calls (for `fit` on an
            ordered stream dataset); `reset_memory()` clears it.
        batch_size: int, the per-replica batch size, required when `stateful`.
        **kwargs: `name`, `dtype` (a dtype policy such as "mixed_bfloat16").

    Call arguments:
        tokens: int `(batch_size, T)`, ids in `[0, n_token)`.
        mems: `None` to start a stream (or in stateful mode), or the list of `n_layer`
            tensors `(batch_size, M, d_model)` returned by the previous call.
        training: bool, enables dropout.
        mem_len, clamp_len, same_length: optional overrides of the config for this call
            (evaluation uses longer memory than training). Not in stateful mode for
            `mem_len`.
        memory_valid: optional int32 scalar: only the last `memory_valid` slots of
            `mems` hold real positions (fixed-shape memory, as trainers keep it).
        cache_kv: bool, also return `"memory_kv"`, the keys and values of the new
            memory, so that the next call need not project the memory again. Exact only
            while the weights do not change (evaluation, generation); relative
            positions only (attn_type 0 or 1).
        memory_kv: optional list of `n_layer` tensors `(batch_size, M, 2 * n_head *
            d_head)`, the `"memory_kv"` of the previous call (implies `cache_kv`);
            without it, `cache_kv` projects `mems` once (`memory_kv(mems)`). Given
            without `mems`, the memory is held only as keys and values (a
            `KeyValueMemory` keeps them in place between calls).
        position_keys: optional list of `n_layer` tensors, `project_positions(K',
            clamp_len)` with `K' >= M + T` and this call's clamp_len: each layer's
            projected position encoding, computed once while the weights do not change
            (attn_type 0) instead of in every call.
        memory_kv_offset: optional int32 scalar: `memory_kv` are then the ring buffers
            of a `KeyValueMemory` (`read_rings()`: head-major, `(2 * n_head,
            batch_size, capacity, d_head)`), of at least `mem_len` rows, and this the
            slot of the oldest row. Each layer's attention reads its ring in time
            order one head group at a time (`RelativeAttention`'s `memory_ring`), so
            no ordered copy of the whole memory is made.
        block_program: optional callable that runs the blocks as `run_blocks(hidden,
            layers, static)` would (e.g. `SharedBlockProgram`: one compiled program that
            every group of blocks calls with its own weights).

    Returns:
        dict with `"hidden"` `(batch_size, T, d_model)` and `"mems"`, the list of
        `n_layer` new memories `(batch_size, min(mem_len, M + T), d_model)` (not when
        the memory is held only as keys and values); with `memory_valid` (or in
        stateful mode) also the new `"memory_valid"`; with `cache_kv` also
        `"memory_kv"`, the new memories' keys and values (not with `memory_kv_offset`:
        the rings' owner stores `"segment_kv"` itself), and `"segment_kv"`, those of
        the segment's rows that enter the memory (`n_layer` tensors `(batch_size,
        T - ext_len, 2 * n_head * d_head)`).

    Example:
    >>> model = TransformerXL(TransformerXLConfig.from_preset("tiny"))
    >>> out = model(np.zeros((2, 8), "int32"))
    >>> out = model(np.zeros((2, 8), "int32"), mems=out["mems"])
    >>> tuple(out["hidden"].shape), tuple(out["mems"][0].shape)
    ((2, 8, 16), (2, 8, 16))
    """

    # No SavedModel signature feeding float32 tokens (Keras's TF backend default); see TransformerXLLM.
    _default_save_signature = None

    def __init__(self, config, stateful=False, batch_size=None, **kwargs):
        super().__init__(**kwargs)
        config = as_config(config)
        self.config = config
        self.stateful = stateful
        self.batch_size = batch_size
        init, proj_init = initializers(config)
        self._init = init
        self.word_emb = AdaptiveEmbedding(
            config.n_token,
            config.d_embed,
            config.d_model,
            cutoffs=config.cutoffs,
            div_val=config.div_val,
            proj_same_dim=config.proj_same_dim,
            embeddings_initializer=init,
            projection_initializer=proj_init,
            dtype=self.dtype_policy,
            name="adaptive_embed",
        )
        self.pos_emb = PositionalEmbedding(config.d_model, dtype=self.dtype_policy, name="pos_emb")
        self.emb_dropout = ReplicaDropout(config.dropout, dtype=self.dtype_policy)
        self.pos_dropout = ReplicaDropout(config.dropout, dtype=self.dtype_policy)
        self.out_dropout = ReplicaDropout(config.dropout, dtype=self.dtype_policy)
        self.blocks = [
            TransformerXLBlock(
                config.n_head,
                config.d_head,
                config.d_inner,
                dropout=config.dropout,
                attention_dropout=config.dropatt,
                position_projection=config.attn_type == 0,
                pre_lnorm=config.pre_lnorm,
                layer_norm_epsilon=config.layer_norm_epsilon,
                kernel_initializer=init,
                dtype=self.dtype_policy,
                name=f"layer_{i}",
            )
            for i in range(config.n_layer)
        ]
        self.memory = MemoryCache(
            config.mem_len,
            config.n_layer,
            config.d_model,
            ext_len=config.ext_len,
            stateful=stateful,
            batch_size=batch_size,
            zero_init=config.mem_init == "zeros",
            dtype=self.dtype_policy,
            name="memory",
        )
        self.build()  # every shape is known from the config

    def build(self, tokens_shape=None):
        if self.built:  # built on construction; the weights do not depend on the batch or time
            return
        c = self.config
        tokens_shape = tuple(tokens_shape or (None, c.tgt_len))
        hidden_shape = tokens_shape[:2] + (c.d_model,)
        self.word_emb.build(tokens_shape)
        for block in self.blocks:
            block.build(hidden_shape)
        heads = (c.n_head, c.d_head)
        if c.attn_type == 0:
            bias_shape = (c.n_layer,) + heads if c.untie_r else heads
            init = weight_initializer
            self.r_w_bias = self.add_weight(name="r_w_bias", shape=bias_shape, initializer=init(self._init))
            self.r_r_bias = self.add_weight(name="r_r_bias", shape=bias_shape, initializer=init(self._init))
        elif c.attn_type == 1:
            self.r_w_bias = self.add_weight(
                name="r_w_bias", shape=(c.n_layer,) + heads, initializer=weight_initializer(self._init)
            )
            self.r_emb = self.add_weight(
                name="r_emb", shape=(c.n_layer, c.max_klen) + heads, initializer=weight_initializer(self._init)
            )
            self.r_bias = self.add_weight(
                name="r_bias", shape=(c.n_layer, c.max_klen, c.n_head), initializer="zeros"
            )
        elif c.attn_type == 3:
            self.r_emb = self.add_weight(
                name="r_emb", shape=(c.n_layer, c.max_klen, c.d_model), initializer=weight_initializer(self._init)
            )
        self.built = True

    # -- checks at the edge -------------------------------------------------------------

    def _check_inputs(self, tokens, mems):
        c = self.config
        if len(tokens.shape) != 2:
            raise ValueError(
                f"Expected `tokens` of shape (batch_size, time). Received shape {tuple(tokens.shape)}"
            )
        dtype = keras.backend.standardize_dtype(tokens.dtype)
        if not dtype.startswith(("int", "uint")):
            raise ValueError(
                f"Expected integer token ids. Received dtype {dtype}; cast them (e.g. "
                "ids.astype('int32')) - float ids are not truncated silently."
            )
        if _is_concrete(tokens):
            values = ops.convert_to_numpy(tokens)
            if values.size and (values.min() < 0 or values.max() >= c.n_token):
                raise ValueError(
                    f"Token ids must be in [0, n_token={c.n_token}). Received ids in "
                    f"[{values.min()}, {values.max()}]; check the vocabulary the data was "
                    "encoded with against the model's n_token."
                )
        if mems is None:
            return
        if self.stateful:
            raise ValueError(
                "This model is stateful: it keeps its memory internally. Do not pass `mems`; "
                "call `reset_memory()` to start new streams, or build it with stateful=False."
            )
        if not isinstance(mems, (list, tuple)) or len(mems) != c.n_layer:
            count = len(mems) if isinstance(mems, (list, tuple)) else type(mems).__name__
            raise ValueError(
                f"Expected `mems` to be a list of n_layer={c.n_layer} tensors (one per layer), "
                f"as returned in out['mems']. Received: {count}"
            )
        lengths = set()
        for i, mem in enumerate(mems):
            shape = tuple(mem.shape)
            batch_ok = shape[0] is None or tokens.shape[0] is None or shape[0] == tokens.shape[0]
            if len(shape) != 3 or shape[2] != c.d_model or not batch_ok:
                raise ValueError(
                    f"Expected mems[{i}] of shape (batch_size={tokens.shape[0]}, mem_len, "
                    f"d_model={c.d_model}). Received shape {shape}"
                )
            lengths.add(shape[1])
        if len(lengths) > 1:
            raise ValueError(f"Expected all mems to have the same length. Received lengths {sorted(lengths)}")

    # -- the forward pass ------------------------------------------------------------------

    @property
    def can_cache_kv(self):
        """Whether the memory's keys and values can be kept between calls: with relative
        positions (attn_type 0 or 1) they do not change from one segment to the next."""
        return self.config.attn_type in (0, 1)

    def memory_kv(self, mems):
        """Keys and values of each layer's memory: `n_layer` tensors
        `(batch_size, M, 2 * n_head * d_head)` (keys first)."""
        return [block.attention.project_kv(mem) for block, mem in zip(self.blocks, mems)]

    def project_positions(self, key_length, clamp_len=None):
        """Each layer's position keys for `key_length` keys (attn_type 0): `n_layer`
        tensors `(n_head, d_head, position_key_length(key_length, clamp_len))`, the
        `position_keys` of a call with at most `key_length` keys and this `clamp_len`
        (default: the config's)."""
        if self.config.attn_type != 0:
            raise ValueError(f"Position keys are projected only with attn_type 0 (the paper's); this is "
                             f"attn_type={self.config.attn_type}.")
        clamp_len = self.config.clamp_len if clamp_len is None else clamp_len
        rows = self.position_key_length(key_length, clamp_len)
        encoding = self.pos_emb(relative_positions(rows), clamp_len=clamp_len)
        return [block.attention.project_positions(encoding) for block in self.blocks]

    @staticmethod
    def position_key_length(key_length, clamp_len):
        """Rows of `project_positions(key_length, clamp_len)`: one per distance below
        `key_length`, of which the distances past `clamp_len` (if > 0) share one."""
        return distinct_distances(key_length, clamp_len)

    def _check_memory_kv(self, memory_kv, mems, ring=False):
        c = self.config
        if not self.can_cache_kv:
            raise ValueError(
                f"Keys and values of the memory can be cached only with relative positions "
                f"(attn_type 0 or 1); attn_type={c.attn_type} adds absolute positions to the "
                "memory, so its keys change every segment. Call without cache_kv/memory_kv."
            )
        if self.stateful:
            raise ValueError("cache_kv/memory_kv need a stateless model (stateful=False).")
        if memory_kv is None:
            return
        listed = isinstance(memory_kv, (list, tuple))
        if ring:
            heads = (2 * c.n_head, c.d_head)
            expected = f"the memory_kv rings to be n_layer={c.n_layer} head-major tensors ({heads[0]}, " \
                       f"batch_size, capacity, {c.d_head}) of KeyValueMemory.read_rings()"

            def fits(kv):
                return len(kv.shape) == 4 and (kv.shape[0], kv.shape[3]) == heads
        else:
            width = 2 * c.n_head * c.d_head
            length = (memory_kv[0].shape[1] if listed and memory_kv else None) if mems is None else mems[0].shape[1]
            expected = f"`memory_kv` to be the list of n_layer={c.n_layer} tensors (batch_size, M={length}, " \
                       f"{width}) returned in out['memory_kv'] with these mems"

            def fits(kv):
                return len(kv.shape) == 3 and kv.shape[2] == width and kv.shape[1] == length
        if not listed or len(memory_kv) != c.n_layer or not all(fits(kv) for kv in memory_kv):
            shapes = [tuple(kv.shape) for kv in memory_kv] if listed else type(memory_kv).__name__
            raise ValueError(f"Expected {expected}. Received {shapes}")

    def call(self, tokens, mems=None, training=False, mem_len=None, clamp_len=None,
             same_length=None, memory_valid=None, cache_kv=False, memory_kv=None, position_keys=None,
             memory_kv_offset=None, block_program=None):
        self._check_inputs(tokens, mems)
        cache_kv = cache_kv or memory_kv is not None
        if memory_kv_offset is not None and (memory_kv is None or mems is not None):
            raise ValueError("`memory_kv_offset` marks `memory_kv` as ring buffers held without `mems`; "
                             "pass the rings as `memory_kv` and no `mems`.")
        if cache_kv:
            self._check_memory_kv(memory_kv, mems, ring=memory_kv_offset is not None)
        settings = self.config.with_memory(mem_len, clamp_len, same_length)
        capacity = memory_kv[0].shape[2] if memory_kv_offset is not None else None
        if capacity is not None and capacity < settings.mem_len:
            raise ValueError(f"The memory_kv rings hold {capacity} rows, fewer than mem_len={settings.mem_len}.")
        if mem_len is not None and self.stateful and mem_len != self.config.mem_len:
            raise ValueError(
                f"A stateful model keeps mem_len={self.config.mem_len}; use a stateless model "
                f"(stateful=False) to run with mem_len={mem_len}."
            )
        if self.stateful:
            mems, memory_valid = self.memory.read()
        elif mems is None and memory_kv is None:
            mems = self.memory.initial_memories(ops.shape(tokens)[0]) if settings.mem_len else None
        kv_only = mems is None and memory_kv is not None
        if cache_kv and memory_kv is None and mems is not None:
            memory_kv = self.memory_kv(mems)

        if position_keys is not None and (self.config.attn_type != 0 or len(position_keys) != self.config.n_layer):
            raise ValueError(f"Expected `position_keys` to be the list of n_layer={self.config.n_layer} tensors "
                             "of project_positions() (attn_type 0 only).")
        hidden, layer_inputs, current_kv = self._forward_layers(
            tokens, mems, memory_kv, memory_valid, settings, cache_kv, training, position_keys,
            memory_kv_offset, block_program)
        out = {"hidden": self.out_dropout(hidden, training=training)}
        if not kv_only:
            out["mems"] = self.memory(layer_inputs, mems, mem_len=settings.mem_len)
        if cache_kv:  # the same update as the memory's, applied to its keys and values
            if memory_kv_offset is None:
                out["memory_kv"] = self.memory(current_kv, memory_kv, mem_len=settings.mem_len)
            kept = ops.shape(tokens)[1] - settings.ext_len
            out["segment_kv"] = [kv[:, :kept] for kv in current_kv] if settings.ext_len else current_kv
        if memory_valid is not None:
            query_length = ops.shape(tokens)[1]
            out["memory_valid"] = ops.minimum(settings.mem_len, memory_valid + query_length - settings.ext_len)
            if self.stateful:
                self.memory.write(out["mems"], out["memory_valid"])
        return out

    def _forward_layers(self, tokens, mems, memory_kv, memory_valid, settings, cache_kv, training,
                        position_keys=None, memory_kv_offset=None, block_program=None):
        """Embedding and the blocks: `(hidden, each layer's input, each layer's current
        keys and values)`."""
        c = settings
        query_length = ops.shape(tokens)[1]
        stored = mems if mems is not None else memory_kv
        memory_length = 0 if stored is None else ops.shape(stored[0])[1]
        if memory_kv_offset is not None:
            memory_length = c.mem_len
        max_distance = None
        if c.same_length:
            max_distance = c.mem_len if c.same_length_convention == "tf" else c.mem_len - 1
        mask = causal_attention_mask(query_length, memory_length, memory_valid, max_distance)
        positions = relative_positions(memory_length + query_length)
        # The sinusoid, unless the position keys come projected already.
        needs_encoding = c.attn_type == 2 or (c.attn_type == 0 and position_keys is None)
        pos_emb = self.pos_emb(positions, clamp_len=c.clamp_len) if needs_encoding else None

        hidden = self.word_emb(tokens)
        if c.attn_type == 2:
            hidden = hidden + pos_emb[memory_length:]
        hidden = self.emb_dropout(hidden, training=training)
        if c.attn_type == 0 and pos_emb is not None:
            pos_emb = self.pos_dropout(pos_emb, training=training)
        rows = self._position_rows(positions, memory_length + query_length, c.clamp_len)
        # Distances past clamp_len share one encoding row, which the layers then score
        # once; not where dropout on the encoding makes those rows differ (training).
        clamp_len = c.clamp_len if c.attn_type == 0 and c.clamp_len > 0 and (
            position_keys is not None or not training or c.dropout == 0) else None

        static = dict(cache_kv=cache_kv, clamp_len=clamp_len, training=training,
                      mem_len=None if memory_kv_offset is None else memory_length)
        layers = []  # each block's arguments besides its input
        for i in range(len(self.blocks)):
            memory = None if mems is None else mems[i]
            absolute, memory = self._absolute_positions(i, memory, memory_length, pos_emb, rows)
            positions = self._relative_position_inputs(i, pos_emb, rows)
            if position_keys is not None:
                positions["position_keys"] = position_keys[i]
                del positions["position_encoding"]
            kv = None if memory_kv is None else memory_kv[i]
            layers.append((memory, kv, memory_kv_offset, mask, positions, absolute))
        hidden, layer_inputs, current_kv = (block_program or self.run_blocks)(hidden, layers, static)
        return hidden, layer_inputs, current_kv if cache_kv else []

    def run_blocks(self, hidden, layers, static, blocks=None):
        """`blocks` (default: all) in turn from `hidden`, block `i` with `layers[i]`:
        `(hidden, each block's input, each block's keys and values)`; see `block_step`."""
        inputs, current_kv = [], []
        for block, args in zip(self.blocks if blocks is None else blocks, layers):
            inputs.append(hidden)
            hidden, kv = self.block_step(block, hidden, *args, **static)
            current_kv.append(kv)
        return hidden, inputs, current_kv

    def block_step(self, block, hidden, memory, memory_kv, memory_kv_offset, mask, positions, absolute,
                   cache_kv, clamp_len, training, mem_len=None):
        """One block of the forward pass: `(hidden, keys and values of its rows)` (None
        without `cache_kv`). `memory_kv` is this layer's (a ring with `memory_kv_offset`,
        read by the attention as its last `mem_len` rows in time order); `positions` the block's
        position arguments (`position_encoding` or `position_keys`, biases); `absolute`
        what attn_type 3 adds to its input (else None)."""
        if absolute is not None:
            hidden = hidden + absolute
        kwargs = dict(positions)
        if clamp_len is not None:
            kwargs["clamp_len"] = clamp_len
        current_kv = None
        if cache_kv:  # the segment's queries, keys and values in one product
            kwargs["queries"], current_kv = block.attention.project_qkv(hidden)
            if memory_kv is None:
                kwargs["context_kv"] = current_kv
            elif memory_kv_offset is not None:  # a head-major ring: keys and values as the scores take them
                # (joined to the segment's by the attention, one head group at a time)
                heads = self.config.n_head
                current = head_major(current_kv, heads)
                kwargs["context_kv"] = (current[:heads], current[heads:])
                kwargs["memory_ring"], kwargs["memory_ring_rows"] = (memory_kv, memory_kv_offset), mem_len
            else:
                kwargs["context_kv"] = ops.concatenate([ops.cast(memory_kv, self.compute_dtype), current_kv], axis=1)
        return block(hidden, memory=memory, attention_mask=mask, training=training, **kwargs), current_kv

    def _position_rows(self, positions, key_length, clamp_len):
        """Rows of the learned position tables (attn_type 1 and 3), else None."""
        c = self.config
        if c.attn_type == 1:
            return self._learned_relative_rows(positions, clamp_len)
        if c.attn_type == 3:
            return ops.maximum(ops.arange(key_length) + (c.max_klen - key_length), 0)
        return None

    def _relative_position_inputs(self, i, pos_emb, rows):
        """Layer `i`'s position arguments of `RelativeAttention` (attn_type 0 and 1)."""
        c = self.config
        if c.attn_type == 0:
            return dict(
                position_encoding=pos_emb,
                content_bias=self.r_w_bias[i] if c.untie_r else self.r_w_bias,
                position_bias=self.r_r_bias[i] if c.untie_r else self.r_r_bias,
            )
        if c.attn_type == 1:
            return dict(
                position_encoding=ops.take(self.r_emb[i], rows, axis=0),
                content_bias=self.r_w_bias[i],
                position_score_bias=ops.take(self.r_bias[i], rows, axis=0),
            )
        return {}

    def _absolute_positions(self, i, memory, memory_length, pos_emb, rows):
        """Absolute positions of layer `i`: `(what its input adds or None, its memory)`
        (attn_type 2: the sinusoid, added to the first layer's memory; 3: a learned table
        per layer, added to the input and the memory)."""
        c = self.config
        if c.attn_type == 2 and i == 0 and memory is not None:
            return None, ops.cast(memory, self.compute_dtype) + pos_emb[:memory_length]
        if c.attn_type == 3:
            absolute = ops.cast(ops.take(self.r_emb[i], rows, axis=0), self.compute_dtype)
            if memory is not None:
                memory = ops.cast(memory, self.compute_dtype) + absolute[:memory_length]
            return absolute[memory_length:], memory
        return None, memory

    def _learned_relative_rows(self, positions, clamp_len):
        """attn_type 1: table row of each descending distance (far distances share the
        oldest row, as the original pads with it)."""
        table = self.config.max_klen
        window = min(clamp_len, table) if clamp_len > 0 else table
        distances = ops.minimum(ops.cast(positions, "int32"), window - 1)
        return table - 1 - distances

    def reset_memory(self):
        """Clear the memory of a stateful model (start new streams)."""
        self.memory.reset()

    def get_config(self):
        return {
            "config": self.config.to_dict(),
            "stateful": self.stateful,
            "batch_size": self.batch_size,
            **{k: v for k, v in super().get_config().items() if k in ("name", "trainable", "dtype")},
        }

    @classmethod
    def from_config(cls, config):
        return cls(**config)


def _is_concrete(x):
    """True for eager tensors and arrays whose values can be read now."""
    if isinstance(x, np.ndarray):
        return True
    if keras.config.backend() == "tensorflow":
        import tensorflow as tf

        return tf.executing_eagerly() and not isinstance(x, keras.KerasTensor) and hasattr(x, "numpy")
    if keras.config.backend() == "jax":
        import jax

        return not isinstance(x, (jax.core.Tracer, keras.KerasTensor))
    return not isinstance(x, keras.KerasTensor)
