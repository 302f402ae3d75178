"""`TransformerXLLM`: the backbone plus the tied adaptive-softmax language-model head."""

import keras
from keras import ops

from txl_keras.layers.adaptive_softmax import AdaptiveSoftmax
from txl_keras.models.config import PRESETS, TransformerXLConfig
from txl_keras.models import layout_map
from txl_keras.models.int8_model import Int8Model
from txl_keras.models.lora_model import LoraModel
from txl_keras.models.transformer_xl import TransformerXL, as_config, as_ids, initializers


def mean_nll(nll, sample_weight=None, extra_losses=()):
    """The language-modelling loss of `fit`: the mean of `nll` (per token, any shape) in
    float32, weighted by `sample_weight` (the same shape; weight 0 leaves padding out),
    plus `extra_losses` (a layer's `losses`)."""
    nll = ops.cast(nll, "float32")
    if sample_weight is None:
        loss = ops.mean(nll)
    else:
        weight = ops.cast(sample_weight, "float32")
        loss = ops.sum(nll * weight) / ops.maximum(ops.sum(weight), 1e-9)
    for extra in extra_losses:
        loss = loss + ops.cast(extra, "float32")
    return loss


@keras.saving.register_keras_serializable(package="txl_keras")
class TransformerXLLM(LoraModel, Int8Model, keras.Model):
    """Transformer-XL language model: `TransformerXL` + `AdaptiveSoftmax` head.

    The contract every other part of txl_keras relies on:

        out = model(tokens, targets=None, mems=None, training=False)

    `out["nll"]` `(batch_size, T)` float32 is the negative log-likelihood (nats) of each
    target when `targets` are given, `out["mems"]` is the memory to pass to the next
    call (`mems=None` starts a stream) and `out["memory_valid"]` how many of its newest
    slots hold real positions, `out["hidden"]` the final hidden states, and
    `out["log_probs"]` `(batch_size, T, n_token)` the full log-probabilities when
    `return_log_probs=True`.

    For frozen weights (evaluation, generation) `call_with_cache(tokens, cache, ...)`
    takes the memory as an `InferenceCache` (`init_cache(batch_size)`) and returns
    `(out, cache)`: with relative positions the memory is held as its keys and values,
    projected once, not at every segment.

    With `stateful=True` the memory stays inside the model, so `model.fit` on an
    ordered dataset of `(inputs, targets)` batches (never shuffled, a fixed batch size)
    trains with memory; `reset_memory()` starts new streams. The training loss is the
    mean NLL.

    Args:
        config: `TransformerXLConfig` (or a dict of its fields).
        stateful: bool.
        batch_size: int, per-replica batch size, required when `stateful`.
        tail_mode: adaptive-softmax tail computation ("auto", "gather", "dense").
        lora_rank, lora_alpha: None, or the LoRA adapters the model is built with
            (`enable_lora`, `txl_keras.models.lora_model`).
        quantization: None, or "int8": the model is built with int8 weights
            (`quantize`, `txl_keras.models.int8_model`).
        **kwargs: `name`, `dtype` (a dtype policy such as "mixed_bfloat16").

    Call arguments:
        tokens: int `(batch_size, T)`.
        targets: optional int `(batch_size, T)`.
        mems: optional list of `n_layer` tensors `(batch_size, M, d_model)`.
        training: bool.
        return_log_probs: bool.
        mem_len, clamp_len, same_length: optional per-call overrides (evaluation).
        memory_valid: optional int32 scalar or `(batch_size,)`, see `TransformerXL`.

    Example:
    >>> model = TransformerXLLM(TransformerXLConfig.from_preset("tiny"))
    >>> x = np.zeros((2, 8), "int32")
    >>> out = model(x, targets=x)
    >>> out = model(x, targets=x, mems=out["mems"])
    >>> tuple(out["nll"].shape)
    (2, 8)
    """

    # Keras's TensorFlow backend would add a SavedModel signature feeding tokens of the
    # compute dtype (float32), which the integer-id check refuses; `txl_keras.export`
    # writes the model's own int32 endpoints instead.
    _default_save_signature = None

    def __init__(self, config, stateful=False, batch_size=None, tail_mode="auto", lora_rank=None, lora_alpha=None,
                 quantization=None, **kwargs):
        super().__init__(**kwargs)
        config = as_config(config)
        self.config = config
        self.stateful = stateful
        self.batch_size = batch_size
        self.tail_mode = tail_mode
        self.backbone = TransformerXL(
            config, stateful=stateful, batch_size=batch_size, dtype=self.dtype_policy, name="transformer"
        )
        init, proj_init = initializers(config)
        self.softmax = AdaptiveSoftmax(
            config.n_token,
            config.d_embed,
            config.d_model,
            cutoffs=config.cutoffs,
            div_val=config.div_val,
            tie_weight=config.tie_weight,
            tie_projs=config.resolved_tie_projs,
            proj_same_dim=config.proj_same_dim,
            cluster_order=config.cluster_order,
            tail_mode=tail_mode,
            embedding=self.backbone.word_emb,
            kernel_initializer=init,
            projection_initializer=proj_init,
            dtype=self.dtype_policy,
            name="adaptive_softmax",
        )
        self.build()
        self._restore_lora(lora_rank, lora_alpha)
        self._restore_quantization(quantization)

    def build(self, tokens_shape=None):
        if self.built:  # built on construction (so Keras never traces it with placeholder inputs)
            return
        tokens_shape = tuple(tokens_shape or (None, self.config.tgt_len))
        self.backbone.build(tokens_shape)
        self.softmax.build(tokens_shape + (self.config.d_model,), tokens_shape)
        self.built = True

    def call(self, tokens, targets=None, mems=None, training=False, return_log_probs=False, mem_len=None,
             clamp_len=None, same_length=None, memory_valid=None):
        out = dict(self.backbone(tokens, mems=mems, training=training, mem_len=mem_len, clamp_len=clamp_len,
                                 same_length=same_length, memory_valid=memory_valid))
        return {**out, **self._head(out["hidden"], tokens, targets, return_log_probs, training)}

    def __call__(self, tokens, *args, targets=None, **kwargs):
        return super().__call__(as_ids(tokens), *args, targets=as_ids(targets), **kwargs)

    @classmethod
    def from_preset(cls, preset, **kwargs):
        """An untrained model of an architecture preset (`PRESETS`, e.g. "wt103_base":
        random weights). Trained models (the paper's releases such as "transfo_xl_wt103",
        run folders, saved presets) load with `txl_keras.TransformerXLCausalLM.from_preset`,
        whose `.model` is this class. `kwargs` go to the constructor (`dtype`, ...)."""
        if preset not in PRESETS:
            raise ValueError(f"{preset!r} is not an architecture preset ({', '.join(sorted(PRESETS))}). A trained "
                             f"model loads with txl_keras.TransformerXLCausalLM.from_preset({preset!r}).model.")
        return cls(TransformerXLConfig.from_preset(preset), **kwargs)

    # KerasHub's `Backbone.get_layout_map(device_mesh, ...)`: see `txl_keras.models.layout_map`.
    get_layout_map = staticmethod(layout_map.get_layout_map)

    def init_cache(self, batch_size, mem_len=None, clamp_len=None, segment_length=None):
        """An `InferenceCache` of an empty memory (see `TransformerXL.init_cache`)."""
        return self.backbone.init_cache(batch_size, mem_len, clamp_len, segment_length)

    def call_with_cache(self, tokens, cache, targets=None, return_log_probs=False, mem_len=None, clamp_len=None,
                        same_length=None, in_place=False):
        """`call` for frozen weights, the memory in `cache`: `(out, the cache advanced by
        the segment)`, `out` with `"hidden"` and, as asked, `"nll"` and `"log_probs"`;
        `mem_len`, `clamp_len` and `same_length` as the cache was made; `in_place` as in
        `TransformerXL.call_with_cache`."""
        hidden, cache = self.backbone.call_with_cache(tokens, cache, mem_len, clamp_len, same_length, in_place)
        return {"hidden": hidden, **self._head(hidden, tokens, targets, return_log_probs, False)}, cache

    def _head(self, hidden, tokens, targets, return_log_probs, training):
        out = {}
        if targets is not None:
            if tuple(targets.shape) != tuple(tokens.shape):
                raise ValueError(
                    f"Expected `targets` of the same shape as `tokens` {tuple(tokens.shape)}. "
                    f"Received shape {tuple(targets.shape)}"
                )
            self.backbone._check_inputs(targets, None)
            out["nll"] = self.softmax(hidden, targets, training=training)
        if return_log_probs:
            out["log_probs"] = self.softmax.log_probs(hidden)
        return out

    def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None, training=True):
        """Mean NLL of `y` (the targets) for `model.fit` / `model.evaluate` (`mean_nll`)."""
        return mean_nll(self.softmax(y_pred["hidden"], y), sample_weight, self.losses)

    def reset_memory(self):
        """Clear the memory of a stateful model (start new streams)."""
        self.backbone.reset_memory()

    def get_config(self):
        return {
            "config": self.config.to_dict(),
            "stateful": self.stateful,
            "batch_size": self.batch_size,
            "tail_mode": self.tail_mode,
            **self._lora_config(),
            **self._quantization_config(),
            **{k: v for k, v in super().get_config().items() if k in ("name", "trainable", "dtype")},
        }

    @classmethod
    def from_config(cls, config):
        return cls(**config)
