"""int8 weights (Keras's `quantize("int8")`) for the layers of Transformer-XL.

Every quantized weight is a table of int8 rows `q = round(w * scale)` with a float32 `scale`
per row, `{name}_scale` beside it: an embedding table `(rows, width)` as it is (one scale
serves a row's lookup and its logit in a tied softmax), a kernel `(in, out)` transposed to
`(out, in)`, so that its scale is per output column, as Keras's `Dense` scales. Activations
stay float: a product is `(x @ q^T) / scale`, so the only error is the weights' rounding (at
most half a step of `max|w| / 127` per row), and generation, which reads every weight once
per token, reads a quarter of the bytes. (Kept as rows, an int8 weight is read along its
contiguous axis: CPU products of a few rows of `x` stream it fastest so, and XLA fuses the
conversion to float into such products only.)
"""

import keras
import numpy as np
from keras import ops

from txl_keras import kernels
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
    q, scale = keras.quantizers.abs_max_quantize(values, axis, to_numpy=True)  # scale 127 / max|values|
    return keras.ops.convert_to_numpy(q), np.squeeze(keras.ops.convert_to_numpy(scale), axis).astype(np.float32)


def to_int8(layer, variable, transpose=False):
    """Replace `variable` of `layer` by its int8 rows (same name, not trainable; a kernel's
    transposed with `transpose`) and add their scale `{name}_scale`: returns `(values,
    scale)`, the new variables."""
    values = keras.ops.convert_to_numpy(variable.value)
    q, scale = quantize_values(values.T if transpose else values, axis=1)
    name, shape = variable.name, q.shape
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
    an int8 one by its rows `(out, in)` and their `scale` `(out,)`."""
    if scale is None:
        return ops.matmul(x, kernel)
    product = int8.times_rows if kernels.fast_kernels_enabled() else int8.times_rows_reference
    return product(x, kernel) / ops.cast(scale, x.dtype)


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


@keras.saving.register_keras_serializable(package="txl_keras")
class QuantizableDense(keras.layers.Dense):
    """Keras's `Dense` whose int8 form is this module's: `quantize("int8")` keeps the
    kernel as int8 rows `(units, in)` with `kernel_scale` `(units,)` and activations float
    (Keras's own int8 `Dense` keeps `(in, units)` and quantizes its inputs too). Saved as
    Keras saves an int8 `Dense`: kernel, bias, kernel_scale. Shapes as `Dense`'s."""

    def quantize(self, mode=None, type_check=True, config=None):
        check_mode(type(self).__name__, mode)
        q, scale = quantize_values(keras.ops.convert_to_numpy(self._kernel.value).T, axis=1)
        shape = tuple(self._kernel.shape)
        del self._kernel
        self.quantized_build(shape, mode)
        self._kernel.assign(q)
        self.kernel_scale.assign(scale)
        self.dtype_policy = f"int8_from_{self.dtype_policy.name}"

    def _int8_build(self, kernel_shape, config=None):
        self.inputs_quantizer = None
        self._kernel = self.add_weight(name="kernel", shape=(kernel_shape[1], kernel_shape[0]), initializer="zeros",
                                       dtype="int8", trainable=False)
        self.kernel_scale = self.add_weight(name="kernel_scale", shape=(self.units,), initializer="ones",
                                            trainable=False)

    def _int8_call(self, inputs, training=None):
        x = matmul(inputs, self._kernel, self.kernel_scale)
        if self.bias is not None:
            x = x + ops.cast(self.bias, x.dtype)
        return x if self.activation is None else self.activation(x)
