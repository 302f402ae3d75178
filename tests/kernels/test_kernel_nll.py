"""The NLL kernels against their references: the written-out gradient of `sparse_nll`, and
`streamed_nll` (online log-sum-exp over pieces of a table) against whole logits."""

import numpy as np
import pytest
from conftest import gradient, to_np
from keras import ops

import reference
from txl_keras.kernels import nll as nll_kernels
from txl_keras.kernels import sparse_nll, sparse_nll_reference


@pytest.mark.parametrize("rows", [5, 0])
def test_sparse_nll_and_its_gradient_match_numpy_and_the_reference(rows):
    rng = np.random.default_rng(7)
    # large logits with a large offset per row: a naive exp would overflow
    logits = (rng.normal(size=(rows, 9)) * 30 + rng.normal(size=(rows, 1)) * 500).astype("float32")
    targets = rng.integers(0, 9, size=(rows,)).astype("int32")
    weights = rng.uniform(0.5, 2.0, size=(rows,)).astype("float32")  # an upstream gradient that is not 1
    x = logits.astype(np.float64)
    want = -reference.log_softmax(x)[np.arange(rows), targets]
    np.testing.assert_allclose(to_np(sparse_nll(logits, targets)), want, rtol=1e-5, atol=1e-3)
    np.testing.assert_allclose(to_np(sparse_nll_reference(logits, targets)), want, rtol=1e-5, atol=1e-3)
    want_grad = weights[:, None] * (reference.softmax(x) - np.eye(9)[targets])
    for nll in (sparse_nll, sparse_nll_reference):  # (v * 1: a tensor, not TF's variable)
        got = gradient(lambda v, nll=nll: ops.multiply(nll(ops.multiply(v, 1.0), targets), weights), logits)
        assert got.shape == (rows, 9)
        np.testing.assert_allclose(got, want_grad, atol=1e-5)


@pytest.mark.parametrize("low,rows,extra,piece", [
    (0, 40, False, 7),     # whole pieces by the loop, then the rows left
    (13, 21, True, 5),     # a cluster's rows of a shared table, then extra rows (the head's tail columns)
    (0, 40, True, 64),     # one piece
    (3, 12, False, 2),
])
def test_streamed_nll_equals_the_reference(low, rows, extra, piece, monkeypatch):
    monkeypatch.setattr(nll_kernels, "PIECE_ALIGN", 1)
    monkeypatch.setattr(nll_kernels, "PIECE_VALUES", piece * 6)  # 6 rows of x: `piece` table rows a piece
    rng = np.random.default_rng(3)
    x = rng.normal(size=(6, 10)).astype("float32")
    table = rng.normal(size=(60, 10)).astype("float32")
    bias = rng.normal(size=(rows,)).astype("float32")
    more = (rng.normal(size=(3, 10)).astype("float32"), rng.normal(size=(3,)).astype("float32")) if extra else None
    targets = rng.integers(0, rows + (3 if extra else 0), size=(6,)).astype("int32")
    want = to_np(nll_kernels.streamed_nll_reference(x, table, bias, targets, low, rows, more))
    logits = x.astype(np.float64) @ table[low:low + rows].T + bias
    if extra:
        logits = np.concatenate([logits, x @ more[0].T + more[1]], axis=1)
    np.testing.assert_allclose(want, -reference.log_softmax(logits)[np.arange(6), targets], rtol=1e-5, atol=1e-4)
    got = to_np(nll_kernels.streamed_nll(ops.convert_to_tensor(x), ops.convert_to_tensor(table), bias, targets, low,
                                         rows, more, wait_for=ops.ones((2,))))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_a_piece_waits_for_a_value_without_changing_its_input():
    """`after(x, value)` orders the pieces of `streamed_nll` (a data dependency on `value`)
    and adds exactly zero, whatever `value` holds."""
    x = np.array([[1.5, -2.0], [0.0, 3.25]], "float32")
    for value in ([np.inf, np.nan, -np.inf], [1e38, 1e38], []):
        np.testing.assert_array_equal(to_np(nll_kernels.after(x, np.array(value, "float32"))), x)
