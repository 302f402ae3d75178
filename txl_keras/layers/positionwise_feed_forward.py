"""The position-wise feed-forward sub-layer of a Transformer-XL block."""

import keras
from keras import ops

from txl_keras.layers import arguments, quantization
from txl_keras.layers.layer_norm import LayerNorm
from txl_keras.layers.replica_dropout import ReplicaDropout
from txl_keras.layers.weight_initializers import copy_initializer


@keras.saving.register_keras_serializable(package="txl_keras")
class PositionwiseFeedForward(quantization.QuantizableLayer, keras.layers.Layer):
    """Dense(ReLU) -> dropout -> Dense -> dropout -> residual -> layer norm.

    Both dense layers have biases (unlike the attention projections). Post-norm by
    default; with `pre_lnorm` the input is normalised first and the residual adds the
    un-normalised input, as in the original PyTorch code. `quantize("int8")` makes both
    kernels int8 rows (`quantization.QuantizableDense`; activations stay float).

    Args:
        inner_dim: int, `d_inner`.
        dropout: float, applied after the ReLU and after the second dense layer.
        pre_lnorm: bool.
        layer_norm_epsilon: float.
        kernel_initializer: initializer of both kernels (biases start at zero).
        **kwargs: base layer arguments (`name`, `dtype`).

    Call arguments:
        inputs: `(batch_size, T, hidden_dim)`.
        training: bool, enables dropout.

    Returns:
        `(batch_size, T, hidden_dim)`.

    Example:
    >>> tuple(PositionwiseFeedForward(inner_dim=16)(keras.random.normal((2, 3, 8))).shape)
    (2, 3, 8)
    """

    def __init__(
        self,
        inner_dim,
        dropout=0.0,
        pre_lnorm=False,
        layer_norm_epsilon=1e-5,
        kernel_initializer="glorot_uniform",
        **kwargs,
    ):
        super().__init__(**kwargs)
        layer = type(self).__name__
        self.inner_dim = arguments.positive_int(layer, "inner_dim", inner_dim)
        self.dropout = arguments.rate(layer, "dropout", dropout)
        self.pre_lnorm = arguments.boolean(layer, "pre_lnorm", pre_lnorm)
        self.layer_norm_epsilon = arguments.positive_float(layer, "layer_norm_epsilon", layer_norm_epsilon)
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.layer_1 = quantization.QuantizableDense(
            inner_dim,
            activation="relu",
            kernel_initializer=copy_initializer(self.kernel_initializer),
            dtype=self.float_policy,
            name="layer_1",
        )
        self.layer_2 = None
        self.inner_dropout = ReplicaDropout(dropout, dtype=self.float_policy)
        self.output_dropout = ReplicaDropout(dropout, dtype=self.float_policy)
        self.layer_norm = LayerNorm(
            epsilon=layer_norm_epsilon, dtype="float32", name="layer_norm"
        )

    def build(self, inputs_shape):
        hidden_dim = inputs_shape[-1]
        self.layer_2 = quantization.QuantizableDense(
            hidden_dim,
            kernel_initializer=copy_initializer(self.kernel_initializer),
            dtype=self.float_policy,
            name="layer_2",
        )
        self.layer_1.build(inputs_shape)
        self.layer_2.build(tuple(inputs_shape[:-1]) + (self.inner_dim,))
        self.layer_norm.build(inputs_shape)
        self.built = True
        self._quantize_if_policy_says()

    def _to_int8(self):
        """Both dense layers' kernels as int8 rows with a scale per output column
        (`quantization.QuantizableDense`)."""
        for dense in (self.layer_1, self.layer_2):
            if dense.quantization_mode is None:
                dense.quantize("int8")

    def _norm(self, x):
        return ops.cast(self.layer_norm(ops.cast(x, "float32")), self.compute_dtype)

    def call(self, inputs, training=False):
        x = self._norm(inputs) if self.pre_lnorm else inputs
        # The rows as one (batch_size * T, hidden_dim) matrix: Dense then multiplies 2-D
        # operands, and TensorFlow's graph optimizer fuses its product, bias and ReLU into
        # one oneDNN kernel (on 3-D inputs a reshape between the product and the bias kept
        # them apart: two more passes over the inner activations).
        shape = ops.shape(x)
        x = ops.reshape(x, (-1, shape[-1]))
        x = self.inner_dropout(self.layer_1(x), training=training)
        x = ops.reshape(self.output_dropout(self.layer_2(x), training=training), shape)
        if self.pre_lnorm:
            return inputs + x
        return self._norm(inputs + x)

    def compute_output_shape(self, inputs_shape):
        return inputs_shape

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "inner_dim": self.inner_dim,
                "dropout": self.dropout,
                "pre_lnorm": self.pre_lnorm,
                "layer_norm_epsilon": self.layer_norm_epsilon,
                "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
            }
        )
        return config
