"""Products with large tables (the adaptive softmax's clusters) that avoid copies and slow layouts."""

import math

import keras
import numpy as np
from keras import ops

FEW_ROWS = 32  # rows of a table per row of `x` from which the table is streamed (`rows_times_table`)
CHUNKED_ROWS = (2, 16)  # rows of `x` [low, high) that take `chunked_rows_times_table` on TensorFlow
CHUNK = 1024  # table rows per product of `chunked_rows_times_table`


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


def chunked_rows_times_table(x, table, chunk=CHUNK):
    """`rows_times_table_reference` as one batched product of `x` with the table's
    consecutive `chunk`-row pieces `(rows // chunk, chunk, width)` (a view of its buffer on
    TensorFlow when `chunk * itemsize` is a multiple of 64), the last `rows % chunk` rows
    by a product of their own. On TensorFlow's CPU kernels, 2 to 15 rows of `x` read a
    tall table this way about 1.5x faster than in one product (bench/skinny_products.py);
    under XLA (JAX) the one product is the faster."""
    rows, width = table.shape
    count = rows // chunk
    flat, xt = ops.reshape(table, (-1,)), ops.transpose(x)
    out = ops.reshape(ops.matmul(ops.reshape(flat[: count * chunk * width], (count, chunk, width)), xt[None]),
                      (count * chunk, -1))
    if count * chunk < rows:
        rest = ops.reshape(flat[count * chunk * width:], (rows - count * chunk, width))
        out = ops.concatenate([out, ops.matmul(rest, xt)], axis=0)
    return ops.transpose(out)


def rows_times_table(x, table, pieces=False):
    """`rows_times_table_reference`, computed as `(table @ x^T)^T` for a few rows of `x`
    against a large table (a tail cluster's tokens, a short segment): CPU matrix products
    stream a tall table far better than they broadcast a few rows over it. With `pieces`
    (the whole table at a generation step) 2 to 15 rows take `chunked_rows_times_table` on
    TensorFlow; the streamed NLL's pieces of a table do not (measured slower there)."""
    rows, width = table.shape
    plain = lambda: rows_times_table_reference(x, table)  # noqa: E731
    few = lambda: ops.transpose(ops.matmul(table, ops.transpose(x)))  # noqa: E731
    chunked = lambda: chunked_rows_times_table(x, table)  # noqa: E731
    n = x.shape[0]
    if width < 128:  # narrow tables (div_val > 1 tails): the plain product is as fast
        return plain()
    low, high = CHUNKED_ROWS
    chunks = pieces and keras.config.backend() == "tensorflow" and rows >= 4 * CHUNK
    if n is not None:
        if n * FEW_ROWS > rows:
            return plain()
        return chunked() if chunks and low <= n < high else few()
    if rows < FEW_ROWS * 512:  # not worth a branch
        return plain()
    count = ops.shape(x)[0]
    streamed = (lambda: ops.cond(ops.logical_and(count >= low, count < high), chunked, few)) if chunks else few
    return ops.cond(count * FEW_ROWS <= rows, streamed, plain)
