"""`TransformerXL`: the backbone that maps token ids and memory to hidden states."""

import keras
import numpy as np
from keras import ops

from txl_keras.layers.adaptive_embedding import AdaptiveEmbedding
from txl_keras.layers.attention_mask import causal_attention_mask
from txl_keras.layers.inference_cache import InferenceCache, head_major, time_major
from txl_keras.layers.memory_cache import MemoryCache
from txl_keras.layers.positional_embedding import PositionalEmbedding, relative_positions
from txl_keras.layers.relative_attention import distinct_distances
from txl_keras.layers.replica_dropout import ReplicaDropout
from txl_keras.layers.transformer_xl_block import TransformerXLBlock
from txl_keras.layers.weight_initializers import weight_initializer
from txl_keras.models.config import TransformerXLConfig
from txl_keras.models import layout_map
from txl_keras.models.int8_model import Int8Model
from txl_keras.models.lora_model import LoraModel


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
class TransformerXL(LoraModel, Int8Model, keras.Model):
    """Transformer-XL backbone: token ids (and memory) -> hidden states (and memory).

    Adaptive input embedding scaled by `sqrt(d_model)`, dropout, `n_layer`
    `TransformerXLBlock`s attending to their memory, dropout. Positions follow
    `config.attn_type` (0: the paper's relative encoding with global biases `u`, `v`
    shared across layers unless `untie_r`; 1: learned relative; 2: absolute sinusoid;
    3: learned absolute per layer). Each layer's memory is the input it saw over the
    last `mem_len` positions (`MemoryCache`, the one place the memory is updated).

    `call` is the model of the paper, for training and any use. `call_with_cache` runs
    the same computation for frozen weights (evaluation, generation) against an
    `InferenceCache` (`init_cache`): with relative positions the memory is held as its
    keys and values, which a segment does not project again.

    Args:
        config: `TransformerXLConfig` (or a dict of its fields).
        stateful: bool, keep the memory in variables across calls (for `fit` on an
            ordered stream dataset); `reset_memory()` clears it.
        batch_size: int, the per-replica batch size, required when `stateful`.
        lora_rank, lora_alpha: None, or the LoRA adapters the model is built with
            (`enable_lora`, `txl_keras.models.lora_model`).
        quantization: None, or "int8": the model is built with int8 weights
            (`quantize`, `txl_keras.models.int8_model`).
        **kwargs: `name`, `dtype` (a dtype policy such as "mixed_bfloat16").

    Call arguments:
        tokens: int `(batch_size, T)`, ids in `[0, n_token)`.
        mems: `None` to start a stream (or in stateful mode), or the list of `n_layer`
            tensors `(batch_size, M, d_model)` returned by the previous call.
        training: bool, enables dropout.
        mem_len, clamp_len, same_length: optional overrides of the config for this call
            (evaluation uses longer memory than training). Not in stateful mode for
            `mem_len`.
        memory_valid: optional int32 scalar or `(batch_size,)` (one count per row): only
            the last `memory_valid` slots of `mems` hold real positions (fixed-shape memory,
            as trainers keep it).

    Returns:
        dict with `"hidden"` `(batch_size, T, d_model)`, `"mems"`, the list of `n_layer`
        new memories `(batch_size, min(mem_len, M + T - ext_len), d_model)`, and
        `"memory_valid"`, how many of their newest slots hold real positions.

    Example:
    >>> model = TransformerXL(TransformerXLConfig.from_preset("tiny"))
    >>> out = model(np.zeros((2, 8), "int32"))
    >>> out = model(np.zeros((2, 8), "int32"), mems=out["mems"])
    >>> tuple(out["hidden"].shape), tuple(out["mems"][0].shape)
    ((2, 8, 16), (2, 8, 16))
    """

    # No SavedModel signature feeding float32 tokens (Keras's TF backend default); see TransformerXLLM.
    _default_save_signature = None

    def __init__(self, config, stateful=False, batch_size=None, lora_rank=None, lora_alpha=None, quantization=None,
                 **kwargs):
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
        self._restore_lora(lora_rank, lora_alpha)
        self._restore_quantization(quantization)

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

    def __call__(self, tokens, *args, **kwargs):
        return super().__call__(as_ids(tokens), *args, **kwargs)

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
        if self.stateful and tokens.shape[0] not in (None, self.batch_size):
            raise ValueError(
                f"This stateful model keeps the memory of batch_size={self.batch_size} streams; received tokens "
                f"of {tokens.shape[0]} streams. Call it with {self.batch_size} streams, or build a model with "
                "that batch size (or stateful=False)."
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

    def call(self, tokens, mems=None, training=False, mem_len=None, clamp_len=None, same_length=None,
             memory_valid=None):
        self._check_inputs(tokens, mems)
        settings = self.config.with_memory(mem_len, clamp_len, same_length)
        _check_valid("memory_valid", memory_valid, 0 if mems is None else mems[0].shape[1])
        if mem_len is not None and self.stateful and mem_len != self.config.mem_len:
            raise ValueError(
                f"A stateful model keeps mem_len={self.config.mem_len}; use a stateless model "
                f"(stateful=False) to run with mem_len={mem_len}."
            )
        if self.stateful:
            mems, memory_valid = self.memory.read()
        elif mems is None:
            mems = self.memory.initial_memories(ops.shape(tokens)[0]) if settings.mem_len else None
        hidden, layer_inputs = self._forward(tokens, mems, memory_valid, settings, training)
        new_mems = self.memory(layer_inputs, mems, mem_len=settings.mem_len)
        if memory_valid is None:
            memory_valid = 0 if mems is None else ops.shape(mems[0])[1]
        valid = self.next_valid(memory_valid, ops.shape(tokens)[1], settings)
        if self.stateful:
            self.memory.write(new_mems, valid)
        return {"hidden": self.out_dropout(hidden, training=training), "mems": new_mems, "memory_valid": valid}

    def _forward(self, tokens, mems, memory_valid, settings, training):
        """Embedding and blocks: `(hidden states before the last dropout, each block's input)`."""
        c = settings
        query_length = ops.shape(tokens)[1]
        memory_length = 0 if mems is None else ops.shape(mems[0])[1]
        mask = self._mask(query_length, memory_length, memory_valid, settings)
        positions = relative_positions(memory_length + query_length)
        encoding = self.pos_emb(positions, clamp_len=c.clamp_len) if c.attn_type in (0, 2) else None
        hidden = self.word_emb(tokens)
        if c.attn_type == 2:
            hidden = hidden + encoding[memory_length:]
        hidden = self.emb_dropout(hidden, training=training)
        if c.attn_type == 0:
            encoding = self.pos_dropout(encoding, training=training)
        rows = self._position_rows(positions, memory_length + query_length, c.clamp_len)
        # Distances past clamp_len share one encoding row, which the layers may then score
        # once; not where dropout on the encoding makes those rows differ (training).
        clamp_len = c.clamp_len if c.attn_type == 0 and c.clamp_len > 0 and (not training or c.dropout == 0) \
            else None
        inputs = []
        for i, block in enumerate(self.blocks):
            inputs.append(hidden)
            absolute, memory = self._absolute_positions(i, None if mems is None else mems[i], memory_length,
                                                        encoding, rows)
            if absolute is not None:
                hidden = hidden + absolute
            hidden = block(hidden, memory=memory, attention_mask=mask, clamp_len=clamp_len, training=training,
                           **self._relative_position_inputs(i, encoding, rows))
        return hidden, inputs

    def _mask(self, query_length, memory_length, memory_valid, settings):
        max_distance = None
        if settings.same_length:  # the TF code shows mem_len + 1 keys to every query, PyTorch's mem_len
            max_distance = settings.mem_len if settings.same_length_convention == "tf" else settings.mem_len - 1
        return causal_attention_mask(query_length, memory_length, memory_valid, max_distance)

    def next_valid(self, memory_valid, query_length, settings):
        """How many memory slots hold real positions after a segment of `query_length`
        tokens (`settings`: the config with this call's memory settings)."""
        return ops.minimum(settings.mem_len, ops.cast(memory_valid, "int32") + query_length - settings.ext_len)

    # -- frozen weights: the memory in an InferenceCache ----------------------------------

    @property
    def can_cache_kv(self):
        """Whether the cache holds the memory's keys and values (relative positions,
        attn_type 0 or 1: they do not change from one segment to the next), rather than
        its hidden states."""
        return self.config.attn_type in (0, 1)

    @property
    def cache_layout(self):
        """`(G, W)` of the cache's rings `(G, batch_size, capacity, W)`: `(2 * n_head,
        d_head)` keys then values, or `(1, d_model)` hidden states."""
        c = self.config
        return (2 * c.n_head, c.d_head) if self.can_cache_kv else (1, c.d_model)

    def memory_rows(self, mems):
        """What an `InferenceCache` holds of memories `(batch_size, L, d_model)` (one per
        layer): their keys and values `(batch_size, L, 2 * n_head * d_head)`, keys first,
        or (absolute positions) the memories themselves."""
        if not self.can_cache_kv:
            return [ops.cast(m, self.compute_dtype) for m in mems]
        return [block.attention.project_kv(m) for block, m in zip(self.blocks, mems)]

    # KerasHub's `Backbone.get_layout_map(device_mesh, ...)`: see `txl_keras.models.layout_map`.
    get_layout_map = staticmethod(layout_map.get_layout_map)

    def init_cache(self, batch_size, mem_len=None, clamp_len=None, segment_length=None):
        """An `InferenceCache` of an empty memory of `batch_size` streams (with `mem_init`
        "zeros", `mem_len` zero rows that count). With attn_type 0 it holds each layer's
        position keys for segments of up to `segment_length` tokens (default `tgt_len`),
        projected once."""
        settings = self.config.with_memory(mem_len, clamp_len)
        zero_init = settings.mem_init == "zeros"
        groups = self.cache_layout[0]
        zero = ops.zeros((batch_size, 1, settings.d_model), self.compute_dtype)
        rings = []
        for row in self.memory_rows([zero] * settings.n_layer):  # a zero row's keys and values, for every slot
            row = head_major(row if zero_init else ops.zeros_like(row), groups)  # (G, batch_size, 1, W)
            shape = ops.shape(row)  # (the batch may be a tensor: a SavedModel's initial memory)
            rings.append(ops.broadcast_to(row, (shape[0], shape[1], settings.mem_len, shape[3])))
        position_keys = ()
        if settings.attn_type == 0:
            position_keys = tuple(self.project_positions(settings.mem_len + (segment_length or settings.tgt_len),
                                                         settings.clamp_len))
        valid = ops.convert_to_tensor(settings.mem_len if zero_init else 0, "int32")
        return InferenceCache(tuple(rings), ops.convert_to_tensor(0, "int32"), valid, position_keys,
                              written=ops.convert_to_tensor(0, "int32"))

    def call_with_cache(self, tokens, cache, mem_len=None, clamp_len=None, same_length=None, in_place=False):
        """`call` for frozen weights: `(hidden (batch_size, T, d_model), the cache advanced by
        the segment)`; `mem_len`, `clamp_len` and `same_length` as the cache was made.
        `in_place`: the cache is one from `InferenceCache.owned()` that nothing reads after
        this call (a token loop's), so a one-token segment is written into its rings."""
        hidden, rows, valid = self.forward_with_cache(tokens, cache, mem_len, clamp_len, same_length)
        return hidden, cache.append(rows, valid, write_after=[hidden] if in_place else None)

    def forward_with_cache(self, tokens, cache, mem_len=None, clamp_len=None, same_length=None):
        """A segment against the cache, which it does not change: `(hidden, the rows the
        segment adds to each layer's memory (batch_size, T - ext_len, G * W), the new count
        of real rows)`."""
        self._check_inputs(tokens, None)
        settings = self.config.with_memory(mem_len, clamp_len, same_length)
        self._check_cache(cache, settings)
        _check_valid("cache.valid", cache.valid, settings.mem_len)
        if self.can_cache_kv:
            hidden, layer_args = self.cached_inputs(tokens, cache, settings)
            hidden, rows = self.run_cached_blocks(hidden, cache, layer_args)
        else:  # absolute positions: the hidden memory in time order, through the plain forward pass
            mems = [time_major(cache.rows(i, settings.mem_len)) for i in range(settings.n_layer)]
            hidden, rows = self._forward(tokens, mems if settings.mem_len else None, cache.valid, settings, False)
        return hidden, self.segment_rows(rows, settings), self.next_valid(cache.valid, ops.shape(tokens)[1], settings)

    def segment_rows(self, rows, settings):
        """The rows of a segment's `rows` that enter the memory (all but the last `ext_len`)."""
        if not settings.ext_len:
            return rows
        return [r[:, : ops.shape(r)[1] - settings.ext_len] for r in rows]

    def cached_inputs(self, tokens, cache, settings):
        """The embedded segment and each block's arguments of `run_cached_blocks`
        (relative positions)."""
        query_length = ops.shape(tokens)[1]
        key_length = settings.mem_len + query_length
        positions = relative_positions(key_length)
        encoding = None
        if settings.attn_type == 0 and not cache.position_keys:
            encoding = self.pos_emb(positions, clamp_len=settings.clamp_len)
        rows = self._position_rows(positions, key_length, settings.clamp_len)
        common = dict(memory_length=settings.mem_len,
                      attention_mask=self._mask(query_length, settings.mem_len, cache.valid, settings),
                      clamp_len=settings.clamp_len if settings.attn_type == 0 and settings.clamp_len > 0 else None)
        layer_args = [{**common, **self._relative_position_inputs(i, encoding, rows)} for i in range(settings.n_layer)]
        return self.word_emb(tokens), layer_args

    def run_cached_blocks(self, hidden, cache, layer_args, blocks=None):
        """`blocks` (default: all) in turn from `hidden`, block `i` against layer `i` of
        `cache` with `layer_args[i]`: `(hidden, each block's keys and values)`."""
        rows = []
        for i, (block, args) in enumerate(zip(self.blocks if blocks is None else blocks, layer_args)):
            hidden, kv = block.call_with_cache(hidden, cache, i, **args)
            rows.append(kv)
        return hidden, rows

    def _check_cache(self, cache, settings):
        c = self.config
        groups, width = self.cache_layout
        if not isinstance(cache, InferenceCache) or len(cache.rings) != c.n_layer:
            raise ValueError(f"Expected an InferenceCache of n_layer={c.n_layer} rings (init_cache()). "
                             f"Received: {type(cache).__name__}")
        for ring in cache.rings:
            shape = tuple(ring.shape)
            if len(shape) != 4 or (shape[0], shape[3]) != (groups, width) or shape[2] < settings.mem_len:
                raise ValueError(f"Expected cache rings of shape ({groups}, batch_size, capacity >= mem_len="
                                 f"{settings.mem_len}, {width}), as init_cache() makes them. Received shape {shape}")

    def project_positions(self, key_length, clamp_len=None):
        """Each layer's position keys for `key_length` keys (attn_type 0): `n_layer`
        tensors `(n_head, d_head, distinct_distances(key_length, clamp_len))`, for calls with
        at most `key_length` keys and this `clamp_len` (default: the config's)."""
        if self.config.attn_type != 0:
            raise ValueError(f"Position keys are projected only with attn_type 0 (the paper's); this is "
                             f"attn_type={self.config.attn_type}.")
        clamp_len = self.config.clamp_len if clamp_len is None else clamp_len
        rows = distinct_distances(key_length, clamp_len)
        encoding = self.pos_emb(relative_positions(rows), clamp_len=clamp_len)
        return [block.attention.project_positions(encoding) for block in self.blocks]

    # -- positions of each layer -------------------------------------------------------------

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
            **self._lora_config(),
            **self._quantization_config(),
            **{k: v for k, v in super().get_config().items() if k in ("name", "trainable", "dtype")},
        }

    @classmethod
    def from_config(cls, config):
        return cls(**config)


def as_ids(tokens):
    """Token ids given as nested Python lists as an array (Keras takes tensors and arrays)."""
    return np.asarray(tokens) if isinstance(tokens, (list, tuple)) else tokens


def _check_valid(name, valid, length):
    """A ValueError unless a concrete count of real memory slots is in `[0, length]`."""
    if valid is None or not isinstance(length, int) or not (isinstance(valid, (int, np.integer)) or _is_concrete(valid)):
        return
    value = np.asarray(ops.convert_to_numpy(valid))
    if value.ndim > 1 or not np.issubdtype(value.dtype, np.integer) or value.min(initial=0) < 0 \
            or value.max(initial=0) > length:
        raise ValueError(f"Expected `{name}` to be an integer in [0, {length}] (the memory's slots), or one per "
                         f"row. Received: {name}={value.tolist()}")


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
