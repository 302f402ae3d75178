"""Products of float rows with int8 rows (a quantized table, or a quantized kernel kept as
`(out, in)`), before the rows' scales.

On TensorFlow's graph kernels the int8 rows would first be converted to a float copy (a
write and a read of four times the int8 bytes) and then multiplied; XLA fuses the conversion
into the product, which then reads the int8 bytes once. So on TensorFlow each product is one
XLA-compiled function, launched from whatever graph calls it (greedy generation: 1.76x the
float32 model's tokens/s, against 1.3x through float copies; bench/RESULTS.md). Both forms
need the int8 operand's contraction along its contiguous axis (rows `(out, in)`): XLA:CPU
does not fuse the conversion into a product along a kernel's `(in, out)` columns. On JAX the
whole step is XLA already and the plain computation is the product.
"""

import functools

import keras
from keras import ops


def times_rows_reference(x, rows):
    """`x @ rows^T` of float `x` `(..., in)` and int8 `rows` `(out, in)` -> `(..., out)` in `x`'s dtype."""
    return ops.matmul(x, ops.transpose(ops.cast(rows, x.dtype)))


@functools.cache
def _compiled_times_rows():
    import tensorflow as tf

    # (reduce_retracing: one trace serves every shape of weights and rows of `x`, which XLA
    # compiles once each when it first meets them)
    @tf.function(jit_compile=True, autograph=False, reduce_retracing=True)
    def times_rows(x, rows):
        # (rows @ x^T)^T: the rows streamed past a few rows of x (kernels.tables.rows_times_table)
        return tf.transpose(tf.matmul(tf.cast(rows, x.dtype), x, transpose_b=True))

    # (a Keras variable is read as a tensor before it is passed)
    return lambda x, rows: times_rows(tf.convert_to_tensor(x), tf.convert_to_tensor(rows))


def times_rows(x, rows):
    """`times_rows_reference`; on TensorFlow one XLA-compiled product."""
    if keras.config.backend() != "tensorflow":
        return times_rows_reference(x, rows)
    shape = ops.shape(x)
    out = _compiled_times_rows()(ops.reshape(x, (-1, shape[-1])), rows)
    return ops.reshape(out, tuple(shape[:-1]) + (rows.shape[0],))
