"""Layer normalisation of the paper's sub-layers (Keras's, with a fast kernel)."""

import keras
from keras import ops

from txl_keras import kernels


@keras.saving.register_keras_serializable(package="txl_keras")
class LayerNorm(keras.layers.LayerNormalization):
    """`keras.layers.LayerNormalization` (same arguments, weights and result); with the fast
    kernels it is computed by `kernels.layer_norm` (its gradient written out) when it
    normalises the last axis with both a scale and an offset, in at least float32 (a
    16-bit policy's output is cast back), as Keras's does.

    Call arguments:
        inputs: `(..., D)`.

    Returns:
        `(..., D)`, of the layer's compute dtype.

    Example:
    >>> x = keras.random.normal((2, 3, 8))
    >>> bool(ops.max(ops.abs(LayerNorm()(x) - keras.layers.LayerNormalization()(x))) < 1e-5)
    True
    """

    def call(self, inputs):
        axis = self.axis if isinstance(self.axis, int) else (self.axis[0] if len(self.axis) == 1 else None)
        last = axis in (-1, len(inputs.shape) - 1) and self.center and self.scale and not self.rms_scaling
        if not (last and kernels.fast_kernels_enabled()):
            return super().call(inputs)
        dtype = "float64" if self.compute_dtype == "float64" else "float32"
        # (a reshape reads each variable into a tensor: TensorFlow's custom gradients take tensors)
        gamma, beta = (ops.cast(ops.reshape(v, v.shape), dtype) for v in (self.gamma, self.beta))
        return ops.cast(kernels.layer_norm(ops.cast(inputs, dtype), gamma, beta, self.epsilon), self.compute_dtype)
