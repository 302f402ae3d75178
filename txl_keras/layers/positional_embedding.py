"""Sinusoid encoding of relative distances (Transformer-XL, section 3.3)."""

import keras
from keras import ops

from txl_keras.layers import arguments


@keras.saving.register_keras_serializable(package="txl_keras")
class PositionalEmbedding(keras.layers.Layer):
    """Sinusoid embedding of relative distances, as in the original Transformer-XL.

    For each distance `p` it returns `[sin(p * f_0), ..., sin(p * f_{d/2-1}),
    cos(p * f_0), ..., cos(p * f_{d/2-1})]` with `f_k = 1 / 10000**(2k / d)`: all sines
    first, then all cosines (not interleaved). Distances larger than `clamp_len` share
    the vector of `clamp_len` when `clamp_len > 0`. The layer has no weights.

    Args:
        hidden_dim: int, even, the width `d` of the encoding (the model's `d_model`).
        clamp_len: int, distances above it are clamped to it; `<= 0` disables clamping.
        **kwargs: base layer arguments (`name`, `dtype`).

    Call arguments:
        positions: float or int tensor of shape `(key_length,)`, the relative
            distances. Transformer-XL passes the descending sequence
            `key_length - 1, ..., 1, 0`; see `relative_positions`.
        clamp_len: optional int overriding the layer's `clamp_len` for this call.

    Returns:
        Tensor of shape `(key_length, hidden_dim)` in the layer's compute dtype.

    Example:
    >>> layer = PositionalEmbedding(hidden_dim=8, clamp_len=4)
    >>> tuple(layer(relative_positions(6)).shape)
    (6, 8)

    References:
        Dai et al., "Transformer-XL: Attentive Language Models Beyond a Fixed-Length
        Context", ACL 2019.
    """

    def __init__(self, hidden_dim, clamp_len=-1, **kwargs):
        super().__init__(**kwargs)
        self.hidden_dim = arguments.positive_even_int(type(self).__name__, "hidden_dim", hidden_dim)
        self.clamp_len = arguments.int_at_least(type(self).__name__, "clamp_len", clamp_len, -1,
                                                "an integer: > 0 clamps, -1 or 0 does not")
        self.built = True

    def call(self, positions, clamp_len=None):
        clamp_len = self.clamp_len if clamp_len is None else clamp_len
        positions = ops.cast(positions, "float32")
        if clamp_len > 0:
            positions = ops.minimum(positions, float(clamp_len))
        exponents = ops.arange(0, self.hidden_dim, 2, dtype="float32") / self.hidden_dim
        inv_freq = 1.0 / ops.power(10000.0, exponents)
        angles = positions[:, None] * inv_freq[None, :]
        encoding = ops.concatenate([ops.sin(angles), ops.cos(angles)], axis=-1)
        return ops.cast(encoding, self.compute_dtype)

    def compute_output_shape(self, positions_shape):
        return (positions_shape[0], self.hidden_dim)

    def get_config(self):
        config = super().get_config()
        config.update({"hidden_dim": self.hidden_dim, "clamp_len": self.clamp_len})
        return config


def relative_positions(key_length):
    """The descending distances `key_length - 1, ..., 0`, float32, shape `(key_length,)`."""
    return ops.arange(key_length - 1, -1, -1, dtype="float32")
