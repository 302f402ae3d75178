"""int8 weights (Keras's `quantize("int8")`) for the layers of Transformer-XL.

A quantized weight keeps its name and shape with int8 values `q = round(w * scale)`, and its
`scale` beside it as `{name}_scale` (float32): per output column of a kernel `(in, out)` (as
Keras's `Dense` does), per row of an embedding table `(rows, width)` (one scale serves the
row's lookup and its logit in a tied softmax). Activations stay float: a product is
`(x @ q) / scale`, so the only error is the weights' rounding (at most half a step of
`max|w| / 127` per column or row), and generation, which reads every weight once per token,
reads a quarter of the bytes.
"""

import keras
import numpy as np
from keras import ops

from txl_keras.kernels import int8

MODES = ("int8",)


def check_mode(owner, mode):
    """`mode` checked: "int8" is the one mode (Keras's other modes are refused by name)."""
    if mode not in MODES:
        raise ValueError(f"{owner} quantizes to 'int8' (int8 weights, float activations). Received: mode={mode!r}")


def quantize_values(values, axis):
    """`(q, scale)` of a float array: int8 `q` of `values`' shape and float32 `scale`
    (`values` reduced over `axis`), `values ~= q / scale` (scale expanded over `axis`)."""
    values = np.asarray(keras.ops.convert_to_numpy(values), np.float32)
    top = np.max(np.abs(values), axis=axis, keepdims=True)
    scale = 127.0 / np.maximum(top, 1e-12)
    q = np.clip(np.round(values * scale), -127, 127).astype(np.int8)
    return q, np.squeeze(scale, axis).astype(np.float32)


def to_int8(layer, variable, axis):
    """Replace `variable` of `layer` by its int8 values (same name, not trainable) and add
    their scale `{name}_scale`: returns `(values, scale)`, the new variables."""
    q, scale = quantize_values(variable.value, axis)
    name, shape = variable.name, tuple(variable.shape)
    unlocked = layer._tracker.locked
    layer._tracker.unlock()
    try:
        layer._untrack_variable(variable)
        values = layer.add_weight(name=name, shape=shape, dtype="int8", initializer="zeros", trainable=False)
        scales = layer.add_weight(name=f"{name}_scale", shape=scale.shape, initializer="ones", trainable=False)
    finally:
        if unlocked:
            layer._tracker.lock()
    values.assign(q)
    scales.assign(scale)
    return values, scales


def matmul(x, kernel, scale=None):
    """`x @ kernel` for rows `x` `(..., in)`: of a float `kernel` `(in, out)` as it is, of
    an int8 kernel by its values `kernel / scale` (`scale` `(out,)`)."""
    if scale is None:
        return ops.matmul(x, kernel)
    return int8.matmul(x, kernel) / ops.cast(scale, x.dtype)


def take_rows(table, ids, scale=None):
    """Rows `ids` of a table `(rows, width)` -> `ids.shape + (width,)`: of an int8 table
    with their scales applied, as float32."""
    rows = ops.take(table, ids, axis=0)
    if scale is None:
        return rows
    return ops.cast(rows, "float32") / ops.take(ops.cast(scale, "float32"), ids, axis=0)[..., None]


class QuantizableLayer:
    """Mixed into a layer whose `quantize(mode)` converts its weights with `to_int8`: the
    layer's dtype policy becomes Keras's `int8_from_<policy>` (so `quantization_mode` says
    "int8" and a saved config rebuilds it quantized), and Keras's call of a quantized layer
    runs the layer's own `call`, which reads the int8 weights itself."""

    @property
    def float_policy(self):
        """The layer's dtype policy without its quantization (`int8_from_float32` ->
        `float32`): the policy its sublayers are made with."""
        name = self.dtype_policy.name
        return keras.DTypePolicy(name.split("_from_", 1)[1]) if self.dtype_policy.quantization_mode else self.dtype_policy

    def _int8_call(self, *args, **kwargs):
        return self.call(*args, **kwargs)

    def _mark_int8(self):
        self._is_quantized = True
        self.dtype_policy = f"int8_from_{self.dtype_policy.name}"

    def _quantize_if_policy_says(self):
        """At the end of `build`: a layer configured quantized (from a saved config) makes
        its int8 weights now, to be overwritten by the saved values."""
        if self.quantization_mode == "int8" and not getattr(self, "_is_quantized", False):
            self._to_int8()
            self._is_quantized = True

    def quantize(self, mode=None, type_check=True, config=None):
        """int8 weights (see the module); Keras's `config` is accepted and its quantizers
        unused: weights are scaled by their absolute maximum, activations stay float."""
        check_mode(type(self).__name__, mode)
        self._to_int8()
        self._mark_int8()
