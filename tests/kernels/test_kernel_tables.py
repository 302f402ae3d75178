"""Products with large tables against their references: `row_blocks` (shared aligned
views), `rows_times_table` (a few rows against a tall table, computed transposed) and
`chunked_rows_times_table` (a tall table as a batch of row pieces)."""

import keras
import numpy as np
import pytest
from conftest import to_np
from keras import ops

from txl_keras.kernels import tables


@pytest.mark.parametrize("width,dtype", [(410, "float32"), (8, "float32"), (16, "float32"), (3, "float16")])
def test_row_blocks_are_the_rows_of_the_reference(width, dtype):
    rows = 45
    table = np.arange(rows * width, dtype=dtype).reshape(rows, width)
    for low, high in [(0, rows), (0, 1), (3, 4), (5, 12), (8, 40), (17, rows), (40, rows), (1, 44)]:
        blocks = [to_np(b) for b in tables.row_blocks(keras.ops.convert_to_tensor(table), low, high)]
        assert sum(len(b) for b in blocks) == high - low
        want = [to_np(b) for b in tables.row_blocks_reference(keras.ops.convert_to_tensor(table), low, high)]
        np.testing.assert_array_equal(np.concatenate(blocks), np.concatenate(want))
        np.testing.assert_array_equal(np.concatenate(blocks), table[low:high])


def test_few_rows_against_a_large_table_give_the_reference_logits():
    """Few rows against a wide, tall table take the streamed product (W @ x^T)^T,
    statically (known row count) or by a runtime branch (dynamic count, TensorFlow)."""
    rng = np.random.default_rng(3)
    table = rng.normal(size=(20000, 128)).astype("float32")
    for n in (3, 700):  # 3 * 32 <= 20000 (streamed), 700 * 32 > 20000 (plain)
        x = rng.normal(size=(n, 128)).astype("float32")
        want = to_np(tables.rows_times_table_reference(ops.convert_to_tensor(x), ops.convert_to_tensor(table)))
        np.testing.assert_allclose(want, x @ table.T, rtol=1e-4, atol=1e-4)
        got = to_np(tables.rows_times_table(ops.convert_to_tensor(x), ops.convert_to_tensor(table)))
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    if keras.config.backend() == "tensorflow":
        import tensorflow as tf

        dynamic = tf.function(lambda x: tables.rows_times_table(x, tf.constant(table)),
                              input_signature=[tf.TensorSpec([None, 128], tf.float32)])
        for n in (3, 700):
            x = rng.normal(size=(n, 128)).astype("float32")
            np.testing.assert_allclose(dynamic(x).numpy(), x @ table.T, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("rows,chunk", [(4096, 1024), (5000, 1024), (4099, 16), (37, 16)])
def test_a_table_in_row_pieces_gives_the_reference_logits(rows, chunk):
    """The pieces cover every row once, the last partial piece included, in order: each
    column of the result is a brute-force dot product of its row of `x` and row of the table."""
    rng = np.random.default_rng(rows)
    table = rng.normal(size=(rows, 64)).astype("float32")
    for n in (1, 2, 8, 15):
        x = rng.normal(size=(n, 64)).astype("float32")
        got = to_np(tables.chunked_rows_times_table(ops.convert_to_tensor(x), ops.convert_to_tensor(table), chunk))
        want = np.einsum("nw,rw->nr", x.astype("float64"), table.astype("float64"))
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_two_to_fifteen_rows_take_the_row_pieces_on_tensorflow(monkeypatch):
    """Which form `rows_times_table(pieces=True)` takes for a tall wide table, by the rows of
    `x` (statically and, on TensorFlow, by a runtime branch), each giving the reference
    logits; without `pieces`, never the pieces."""
    rng = np.random.default_rng(5)
    table = rng.normal(size=(4 * tables.CHUNK + 7, 128)).astype("float32")
    taken = []
    chunked = tables.chunked_rows_times_table
    monkeypatch.setattr(tables, "chunked_rows_times_table", lambda *a: taken.append(1) or chunked(*a))
    expect = keras.config.backend() == "tensorflow"
    for n, pieces in [(1, False), (2, expect), (8, expect), (15, expect), (16, False), (200, False)]:
        x = rng.normal(size=(n, 128)).astype("float32")
        taken.clear()
        got = to_np(tables.rows_times_table(ops.convert_to_tensor(x), ops.convert_to_tensor(table), pieces=True))
        assert bool(taken) == pieces, n
        np.testing.assert_allclose(got, x @ table.T, rtol=1e-4, atol=1e-4)
        taken.clear()
        tables.rows_times_table(ops.convert_to_tensor(x), ops.convert_to_tensor(table))
        assert not taken
    if expect:
        import tensorflow as tf

        dynamic = tf.function(lambda x: tables.rows_times_table(x, tf.constant(table), pieces=True),
                              input_signature=[tf.TensorSpec([None, 128], tf.float32)])
        for n in (1, 8, 16, 300):
            x = rng.normal(size=(n, 128)).astype("float32")
            np.testing.assert_allclose(dynamic(x).numpy(), x @ table.T, rtol=1e-4, atol=1e-4)
