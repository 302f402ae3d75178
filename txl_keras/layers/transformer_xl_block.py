"""One Transformer-XL decoder layer: relative attention then feed-forward."""

import keras

from txl_keras.layers import arguments
from txl_keras.layers.positionwise_feed_forward import PositionwiseFeedForward
from txl_keras.layers.relative_attention import RelativeAttention


@keras.saving.register_keras_serializable(package="txl_keras")
class TransformerXLBlock(keras.layers.Layer):
    """`RelativeAttention` (with its residual and norm) followed by
    `PositionwiseFeedForward` (with its own).

    Args:
        num_heads: int.
        head_dim: int.
        inner_dim: int, `d_inner`.
        dropout: float.
        attention_dropout: float, `dropatt`.
        position_projection: None, True or False, see `RelativeAttention`.
        pre_lnorm: bool.
        layer_norm_epsilon: float.
        kernel_initializer: initializer of every kernel.
        **kwargs: base layer arguments (`name`, `dtype`).

    Call arguments:
        inputs: `(batch_size, T, hidden_dim)`.
        memory, position_encoding, content_bias, position_bias, position_score_bias,
        attention_mask, clamp_len: as in `RelativeAttention`.
        training: bool.

    Returns:
        `(batch_size, T, hidden_dim)`. `call_with_cache(inputs, cache, layer,
        memory_length, ...)` (frozen weights, see `RelativeAttention.call_with_cache`)
        returns it and the segment's keys and values.

    Example:
    >>> block = TransformerXLBlock(num_heads=2, head_dim=4, inner_dim=16)
    >>> h = keras.random.normal((2, 3, 8))
    >>> tuple(block(h, position_encoding=keras.random.normal((3, 8))).shape)
    (2, 3, 8)
    """

    def __init__(
        self,
        num_heads,
        head_dim,
        inner_dim,
        dropout=0.0,
        attention_dropout=0.0,
        position_projection=None,
        pre_lnorm=False,
        layer_norm_epsilon=1e-5,
        kernel_initializer="glorot_uniform",
        **kwargs,
    ):
        super().__init__(**kwargs)
        layer = type(self).__name__  # the arguments checked here, so that an error names this layer
        for name, value in (("num_heads", num_heads), ("head_dim", head_dim), ("inner_dim", inner_dim)):
            arguments.positive_int(layer, name, value)
        for name, value in (("dropout", dropout), ("attention_dropout", attention_dropout)):
            arguments.rate(layer, name, value)
        arguments.boolean(layer, "position_projection", position_projection, allow_none=True)
        arguments.boolean(layer, "pre_lnorm", pre_lnorm)
        arguments.positive_float(layer, "layer_norm_epsilon", layer_norm_epsilon)
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.attention = RelativeAttention(
            num_heads,
            head_dim,
            dropout=dropout,
            attention_dropout=attention_dropout,
            position_projection=position_projection,
            pre_lnorm=pre_lnorm,
            layer_norm_epsilon=layer_norm_epsilon,
            kernel_initializer=self.kernel_initializer,
            dtype=self.dtype_policy,
            name="rel_attn",
        )
        self.feed_forward = PositionwiseFeedForward(
            inner_dim,
            dropout=dropout,
            pre_lnorm=pre_lnorm,
            layer_norm_epsilon=layer_norm_epsilon,
            kernel_initializer=self.kernel_initializer,
            dtype=self.dtype_policy,
            name="ff",
        )
        for name in ("num_heads", "head_dim", "dropout", "attention_dropout", "pre_lnorm", "layer_norm_epsilon"):
            setattr(self, name, getattr(self.attention, name))
        self.inner_dim = self.feed_forward.inner_dim

    @property
    def position_projection(self):
        return self.attention.position_projection

    def build(self, inputs_shape, position_encoding_shape=None):
        self.attention.build(inputs_shape, position_encoding_shape)
        self.feed_forward.build(inputs_shape)
        self.built = True

    def call(self, inputs, memory=None, position_encoding=None, content_bias=None, position_bias=None,
             position_score_bias=None, attention_mask=None, clamp_len=None, training=False):
        x = self.attention(inputs, memory=memory, position_encoding=position_encoding, content_bias=content_bias,
                           position_bias=position_bias, position_score_bias=position_score_bias,
                           attention_mask=attention_mask, clamp_len=clamp_len, training=training)
        return self.feed_forward(x, training=training)

    def call_with_cache(self, inputs, cache, layer, memory_length, **attention_args):
        x, segment_kv = self.attention.call_with_cache(inputs, cache, layer, memory_length, **attention_args)
        return self.feed_forward(x, training=False), segment_kv

    def compute_output_shape(self, inputs_shape, *args, **kwargs):
        return inputs_shape

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "num_heads": self.num_heads,
                "head_dim": self.head_dim,
                "inner_dim": self.inner_dim,
                "dropout": self.dropout,
                "attention_dropout": self.attention_dropout,
                "position_projection": self.position_projection,
                "pre_lnorm": self.pre_lnorm,
                "layer_norm_epsilon": self.layer_norm_epsilon,
                "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
            }
        )
        return config
