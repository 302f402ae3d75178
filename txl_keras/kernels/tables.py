"""Products with large tables (the adaptive softmax's clusters) that avoid copies and slow layouts."""

import math

import keras
import numpy as np
from keras import ops

FEW_ROWS = 32  # rows of a table per row of `x` from which the table is streamed (`rows_times_table`)


def row_blocks_reference(table, low, high):
    """Rows `[low, high)` of a `(rows, width)` table, as a list of one block."""
    return [table[low:high]]


def row_blocks(table, low, high):
    """`row_blocks_reference` as consecutive blocks that share the table's buffer.

    TensorFlow copies a row slice unless a row's bytes are a multiple of 64 (d_embed 410 is
    not), but shares the buffer of a 1-D slice whose ends are 64-byte aligned. So the rows
    are taken from the table's flat view: one shared block between the first and last
    aligned rows, and the few rows outside it (fewer than 16 at each end) as small copies.
    Concatenated, the blocks are `table[low:high]`.
    """
    width = table.shape[-1]
    itemsize = np.dtype(keras.backend.standardize_dtype(table.dtype)).itemsize
    step = max(1, 64 // math.gcd(width * itemsize, 64))  # rows between aligned offsets
    start, end = -(-low // step) * step, high // step * step
    if end <= start:
        return [table[low:high]]
    flat = ops.reshape(table, (-1,))
    blocks = [table[low:start]] if start > low else []
    blocks.append(ops.reshape(flat[start * width: end * width], (end - start, width)))
    if end < high:
        blocks.append(table[end:high])
    return blocks


def rows_times_table_reference(x, table):
    """`x @ table^T`: `(n, width)` and `(rows, width)` -> `(n, rows)`."""
    return ops.matmul(x, ops.transpose(table))


def rows_times_table(x, table):
    """`rows_times_table_reference`, computed as `(table @ x^T)^T` for a few rows of `x`
    against a large table (a tail cluster's tokens, a short segment): CPU matrix products
    stream a tall table far better than they broadcast a few rows over it."""
    rows, width = table.shape
    plain = lambda: rows_times_table_reference(x, table)  # noqa: E731
    few = lambda: ops.transpose(ops.matmul(table, ops.transpose(x)))  # noqa: E731
    n = x.shape[0]
    if width < 128:  # narrow tables (div_val > 1 tails): the plain product is as fast
        return plain()
    if n is not None:
        return few() if n * FEW_ROWS <= rows else plain()
    if rows < FEW_ROWS * 512:  # not worth a branch
        return plain()
    return ops.cond(ops.shape(x)[0] * FEW_ROWS <= rows, few, plain)
