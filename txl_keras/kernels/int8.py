"""Products of float rows with int8 weights (the values of a quantized kernel or table,
before their scales).

On TensorFlow's graph kernels the int8 weights are first converted to a float copy (a write
and a read of four times the int8 bytes); XLA fuses the conversion into the product, which
then reads the int8 bytes once. A tall table (the adaptive softmax's, read whole at every
generation step) is therefore multiplied by an XLA-compiled product on TensorFlow
(`times_table`, three times faster than the float32 product: bench/RESULTS.md); the layers'
kernels, a few MB each, are not (an XLA launch per product cost more than it saved). On JAX
the whole step is XLA already and the plain computations are as fast.
"""

import functools

import keras
from keras import ops


def matmul(x, kernel):
    """`x @ kernel` of float rows `x` `(..., in)` and int8 `kernel` `(in, out)` -> `(..., out)` in `x`'s dtype."""
    return ops.matmul(x, ops.cast(kernel, x.dtype))


def times_table_reference(x, table):
    """`x @ table^T` of float rows `x` `(n, width)` and an int8 `table` `(rows, width)` -> `(n, rows)`."""
    return ops.matmul(x, ops.transpose(ops.cast(table, x.dtype)))


@functools.cache
def _compiled_times_table():
    import tensorflow as tf

    @tf.function(jit_compile=True, autograph=False)
    def times_table(x, table):
        # (table @ x^T)^T: a tall table streamed past a few rows (kernels.tables.rows_times_table)
        return tf.transpose(tf.matmul(tf.cast(table, x.dtype), x, transpose_b=True))

    # (a Keras variable is read as a tensor before it is passed)
    return lambda x, table: times_table(tf.convert_to_tensor(x), tf.convert_to_tensor(table))


def times_table(x, table):
    """`times_table_reference`; on TensorFlow one XLA-compiled product."""
    if keras.config.backend() != "tensorflow":
        return times_table_reference(x, table)
    return _compiled_times_table()(x, table)
