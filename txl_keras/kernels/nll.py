"""Negative log-likelihoods of targets under logits, with a written-out gradient or streamed
over a large table."""

from keras import ops

from txl_keras.kernels import int8
from txl_keras.kernels.tables import row_blocks, rows_times_table

# `streamed_nll` takes the table in pieces whose logits hold at most PIECE_VALUES values
# (4 MB: the exp and sum passes over a piece then run from the cache) when the row count
# is static, else PIECE_ROWS rows; pieces start at multiples of PIECE_ALIGN rows, so that
# `row_blocks` shares the table's buffer.
PIECE_VALUES = 1 << 20
PIECE_ROWS = 1 << 14
PIECE_ALIGN = 64


def sparse_nll_reference(logits, targets):
    """`-log softmax(logits)[target]` of each row: float logits `(n, V)`, int32 targets
    `(n,)` in `[0, V)` -> `(n,)`."""
    log_probs = ops.log_softmax(logits, axis=-1)
    return -ops.take_along_axis(log_probs, targets[:, None], axis=-1)[:, 0]


def sparse_nll(logits, targets):
    """`sparse_nll_reference` as log-sum-exp minus the target's logit, with the gradient
    `upstream * (softmax - one_hot(target))` written out: the softmax's `exp` kept from the
    forward pass, then one scatter at the targets (autodiff of the log-softmax and the pick
    scatters into all the logits instead)."""

    @ops.custom_gradient
    def nll(logits):
        # (with `initial`, no rows is no error: a tail cluster without tokens in a batch)
        top = ops.stop_gradient(ops.max(logits, axis=-1, keepdims=True, initial=float("-inf")))
        exp = ops.exp(logits - top)
        total = ops.sum(exp, axis=-1)
        picked = ops.take_along_axis(logits, targets[:, None], axis=-1)[:, 0]

        def grad(*args, upstream=None):  # (TF and JAX pass `upstream` first, PyTorch by name)
            upstream = args[0] if upstream is None else upstream
            softmax_part = exp * (upstream / total)[:, None]
            rows = ops.arange(ops.shape(targets)[0], dtype="int32")
            at_targets = ops.take_along_axis(softmax_part, targets[:, None], axis=-1)[:, 0]
            return ops.scatter_update(softmax_part, ops.stack([rows, targets], axis=1), at_targets - upstream)

        return ops.log(total) + top[:, 0] - picked, grad

    return nll(ops.convert_to_tensor(logits))


def table_logits(x, blocks, bias, scale=None):
    """float32 logits `(n, rows)` of rows `x` `(n, width)` against the row `blocks` of a
    table (concatenated: `(rows, width)`) plus `bias` `(rows,)`; int8 blocks hold a
    quantized table's values, whose logits are divided by the rows' `scale` `(rows,)`."""
    parts = [int8.times_rows(x, block) if block.dtype == "int8" else rows_times_table(x, ops.cast(block, x.dtype))
             for block in blocks]
    logits = ops.cast(ops.concatenate(parts, axis=-1) if len(parts) > 1 else parts[0], "float32")
    if scale is not None:
        logits = logits / ops.cast(scale, "float32")
    return logits + ops.cast(bias, "float32")


def streamed_nll_reference(x, table, bias, targets, low, rows, extra=None, scale=None):
    """The NLL of `targets` under the logits of `x` `(n, width)` against the table's rows
    `[low, low + rows)` `(R, width)` with `bias` `(rows,)` (and, for an int8 table, the
    rows' `scale` `(rows,)`), followed by the `extra` rows `(weights (k, width), bias (k,))`
    if given: targets `(n,)` in `[0, rows + k)` -> float32 `(n,)`."""
    logits = table_logits(x, [table[low:low + rows]], bias, scale)
    if extra is not None:
        logits = ops.concatenate([logits, table_logits(x, [extra[0]], extra[1])], axis=-1)
    return sparse_nll_reference(logits, targets)


def piece_rows(n):
    """Table rows per piece of `streamed_nll` for `n` rows of `x` (None: unknown)."""
    if n is None:
        return PIECE_ROWS
    return max(PIECE_ALIGN, PIECE_VALUES // max(n, 1) // PIECE_ALIGN * PIECE_ALIGN)


def after(x, value):
    """`x`, computed only once `value` is: `x` plus a zero that depends on `value` (`sum >
    inf` is False whatever the values, NaN and inf included). A graph executor runs
    whatever is ready; this keeps a later piece's logits from being computed before an
    earlier one is reduced."""
    return ops.add(x, ops.cast(ops.sum(value) > float("inf"), x.dtype))


def streamed_nll(x, table, bias, targets, low, rows, extra=None, wait_for=None, scale=None):
    """`streamed_nll_reference` without the logits of all the rows at once, nor a copy of
    the table: the log-sum-exp is kept online over pieces of the rows (`piece_rows`), the
    whole pieces by one loop (one piece's operations in the graph, not one set per piece),
    then the rows left and the `extra` rows. Each piece's logits wait for the previous
    piece's maximum (`after`), so at most two pieces' logits exist at once; the first
    waits for `wait_for` if given."""
    step = min(piece_rows(x.shape[0]), rows)
    whole = rows // step
    start_top = ops.full(ops.shape(targets), float("-inf"), "float32")
    state = (start_top if wait_for is None else after(start_top, wait_for),
             ops.zeros(ops.shape(targets), "float32"), ops.zeros(ops.shape(targets), "float32"))

    def add_piece(state, blocks, piece_bias, start, piece_scale=None):
        top, total, picked = state
        logits = table_logits(after(x, top), blocks, piece_bias, piece_scale)
        width = logits.shape[-1]
        # (with `initial`, no rows is no error; kept dims: Keras's PyTorch max of no rows drops the axis)
        new_top = ops.maximum(top, ops.max(logits, axis=-1, keepdims=True, initial=float("-inf"))[:, 0])
        total = total * ops.exp(top - new_top) + ops.sum(ops.exp(logits - new_top[:, None]), axis=-1)
        local = targets - start
        value = ops.take_along_axis(logits, ops.clip(local, 0, width - 1)[:, None], axis=-1)[:, 0]
        return new_top, total, picked + ops.where(ops.logical_and(local >= 0, local < width), value, 0.0)

    if whole > 1:
        # A piece of the flat table: where its first row's offset is a multiple of 64 bytes
        # TensorFlow shares the table's buffer (see `row_blocks`), else copies it.
        flat, width = ops.reshape(table, (-1,)), table.shape[-1]
        bias_values = ops.convert_to_tensor(bias)  # (JAX's loop takes arrays, not variables)
        scale_values = None if scale is None else ops.convert_to_tensor(scale)

        def body(k, state):
            start = k * step
            block = ops.reshape(ops.slice(flat, ((low + start) * width,), (step * width,)), (step, width))
            piece_scale = None if scale is None else ops.slice(scale_values, (start,), (step,))
            return add_piece(state, [block], ops.slice(bias_values, (start,), (step,)), start, piece_scale)

        state = ops.fori_loop(0, whole, body, state)
    else:
        state = add_piece(state, row_blocks(table, low, low + step), bias[:step], 0,
                          None if scale is None else scale[:step])
    done = whole * step
    if done < rows:
        state = add_piece(state, row_blocks(table, low + done, low + rows), bias[done:], done,
                          None if scale is None else scale[done:])
    if extra is not None:
        state = add_piece(state, [extra[0]], extra[1], rows)
    top, total, picked = state
    return top + ops.log(total) - picked
