"""Adaptive softmax (Grave et al., 2017) with the projections of Transformer-XL."""

import math

import keras
import numpy as np
from keras import ops

from txl_keras.layers.adaptive_embedding import check_cutoffs, cluster_bounds
from txl_keras.layers.weight_initializers import weight_initializer

CLUSTER_ORDERS = ("tf", "pytorch")
TAIL_MODES = ("auto", "gather", "dense")
FEW_ROWS = 32  # rows of a table per row of hidden states above which the table is streamed
# Outside training the NLL is taken over pieces of the vocabulary in turn, each's logits at
# most PIECE_VALUES values (4 MB: the exp and sum passes over a piece then run from the
# cache, 20% faster than pieces of 16 MB for 1,024 tokens) when the token count is static,
# else PIECE_ROWS rows.
PIECE_VALUES = 1 << 20
PIECE_ROWS = 1 << 14
PIECE_ALIGN = 64  # pieces start at multiples of 64 rows (row_blocks then shares the table)


def row_blocks(table, low, high):
    """Rows `[low, high)` of a `(rows, width)` table as a list of consecutive blocks
    (concatenated, they are `table[low:high]`).

    TensorFlow copies a row slice unless a row's bytes are a multiple of 64 (d_embed 410
    is not: 262 MB per wt103 tail cluster and call), but shares the buffer of a 1-D
    slice whose ends are 64-byte aligned. So the rows are taken from the table's flat
    view: one shared block between the first and last aligned rows, and the few rows
    outside it (fewer than 16 at each end) as small copies.
    """
    width = table.shape[-1]
    itemsize = np.dtype(keras.backend.standardize_dtype(table.dtype)).itemsize
    step = max(1, 64 // math.gcd(width * itemsize, 64))  # rows between aligned offsets
    start, end = -(-low // step) * step, high // step * step
    if end <= start:
        return [table[low:high]]
    flat = ops.reshape(table, (-1,))
    blocks = [table[low:start]] if start > low else []
    blocks.append(ops.reshape(flat[start * width : end * width], (end - start, width)))
    if end < high:
        blocks.append(table[end:high])
    return blocks


def sparse_nll(logits, targets):
    """`-log softmax(logits)[target]` of each row: float logits `(n, V)` and int32
    targets `(n,)` in `[0, V)` -> `(n,)`, with the gradient `upstream * (softmax -
    one_hot(target))` written out: the softmax's `exp` kept from the forward pass, then
    one scatter at the targets. (TensorFlow's fused sparse cross-entropy kernel takes
    1.6-2x as long for the same forward and backward, measured on 2-core Xeon CPUs.)"""

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


def _after(x, value):
    """`x`, computed only once `value` is: `x` plus a zero that depends on `value` (`sum >
    inf` is False whatever the values, NaN and inf included). A graph executor runs
    whatever is ready, so without it TensorFlow's computed the logits of every piece
    before reducing any: ~100 MB held at once for wt103 at 1,024 tokens, in some runs."""
    return ops.add(x, ops.cast(ops.sum(value) > float("inf"), x.dtype))


@keras.saving.register_keras_serializable(package="txl_keras")
class AdaptiveSoftmax(keras.layers.Layer):
    """Per-token negative log-likelihood, and full log-probabilities, of an adaptive
    softmax whose weights may be tied to an `AdaptiveEmbedding`.

    The head scores the shortlist (cluster 0) plus one logit per tail cluster; a tail
    token's log-probability is its cluster's head log-probability plus its log-softmax
    within the cluster. Cluster `i` logits are `(h @ P_i^T) @ W_i^T + b_i`, where `W_i`
    is the cluster's embedding table (tied when `tie_weight`), `P_i` its
    `(width_i, hidden_dim)` projection (the embedding's when `tie_projs[i]`, its own
    otherwise, none when the width equals `hidden_dim` and, for `div_val > 1`,
    `proj_same_dim` is False), and `b_i` an untied bias. Without cutoffs this is a
    plain softmax with bias. `cluster_W`/`cluster_b` (zero-initialised) hold the tail
    cluster logits of the head; `cluster_order="tf"` puts cluster `i` at head column
    `cutoffs[0] + i - 1` (original TF code and its checkpoints), `"pytorch"` at column
    `-i` (original PyTorch code).

    The NLL never builds full-vocabulary logits: with `tail_mode="gather"` a tail
    cluster's logits are computed only for the tokens whose target is in it (dynamic
    shapes: TensorFlow and PyTorch); `"dense"` computes them for every token (static
    shapes: JAX, XLA); `"auto"` picks `"dense"` on JAX, `"gather"` elsewhere.

    Args:
        vocabulary_size: int, `n_token`.
        embedding_dim: int, `d_embed`.
        hidden_dim: int, `d_model`.
        cutoffs: increasing ints.
        div_val: int >= 1.
        tie_weight: bool, use the embedding's tables as output weights.
        tie_projs: list of bools, one per cluster, use the embedding's projection.
        proj_same_dim: bool.
        cluster_order: "tf" or "pytorch".
        tail_mode: "auto", "gather" or "dense".
        embedding: the `AdaptiveEmbedding` to tie to (not serialised; the owning model
            passes it). Required when anything is tied.
        kernel_initializer: initializer of untied tables.
        projection_initializer: initializer of untied projections.
        **kwargs: base layer arguments (`name`, `dtype`).

    Call arguments:
        hidden: `(batch_size, T, hidden_dim)`.
        targets: int `(batch_size, T)`, ids in `[0, vocabulary_size)`.
        training: with `False` (no gradients wanted), the NLL is taken over the
            vocabulary in pieces of at most 4 MB of logits instead of whole clusters.

    Returns:
        float32 `(batch_size, T)`, the negative log-likelihood of each target.
        `log_probs(hidden)` returns float32 `(batch_size, T, vocabulary_size)`.

    Example:
    >>> softmax = AdaptiveSoftmax(10, 8, 8, cutoffs=[4], tie_weight=False,
    ...                           tie_projs=[False, False])
    >>> tuple(softmax(keras.random.normal((2, 3, 8)), ops.array([[0, 5, 9], [1, 2, 3]])).shape)
    (2, 3)

    References:
        Grave et al., "Efficient softmax approximation for GPUs", ICML 2017.
    """

    def __init__(
        self,
        vocabulary_size,
        embedding_dim,
        hidden_dim,
        cutoffs=(),
        div_val=1,
        tie_weight=True,
        tie_projs=None,
        proj_same_dim=True,
        cluster_order="tf",
        tail_mode="auto",
        embedding=None,
        kernel_initializer="glorot_uniform",
        projection_initializer="glorot_uniform",
        **kwargs,
    ):
        super().__init__(**kwargs)
        check_cutoffs(vocabulary_size, cutoffs, embedding_dim, div_val)
        n_clusters = len(cutoffs) + 1
        if tie_projs is None:
            tie_projs = [False] * n_clusters
        if len(tie_projs) != n_clusters:
            raise ValueError(
                f"Expected one `tie_projs` entry per cluster ({n_clusters}). "
                f"Received: tie_projs={list(tie_projs)}"
            )
        if cluster_order not in CLUSTER_ORDERS:
            raise ValueError(
                f"Expected `cluster_order` in {CLUSTER_ORDERS}. Received: {cluster_order!r}"
            )
        if tail_mode not in TAIL_MODES:
            raise ValueError(f"Expected `tail_mode` in {TAIL_MODES}. Received: {tail_mode!r}")
        self.vocabulary_size = vocabulary_size
        self.embedding_dim = embedding_dim
        self.hidden_dim = hidden_dim
        self.cutoffs = list(cutoffs)
        self.div_val = div_val
        self.tie_weight = tie_weight
        self.tie_projs = [bool(t) for t in tie_projs]
        self.proj_same_dim = proj_same_dim
        self.cluster_order = cluster_order
        self.tail_mode = tail_mode
        self.embedding = embedding
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.projection_initializer = keras.initializers.get(projection_initializer)
        self.bounds = cluster_bounds(vocabulary_size, cutoffs)

    @property
    def n_clusters(self):
        return len(self.cutoffs) + 1

    def _width(self, i):
        return self.embedding_dim if self.div_val == 1 else self.embedding_dim // self.div_val**i

    def head_column(self, i):
        """The head column of tail cluster `i` (1-based)."""
        n_tail = len(self.cutoffs)
        row = i - 1 if self.cluster_order == "tf" else n_tail - i
        return self.bounds[1] + row

    def build(self, hidden_shape=None, targets_shape=None):
        if (self.tie_weight or any(self.tie_projs)) and self.embedding is None:
            raise ValueError(
                "AdaptiveSoftmax ties weights to an AdaptiveEmbedding "
                f"(tie_weight={self.tie_weight}, tie_projs={self.tie_projs}) but none was "
                "given; pass `embedding=` or untie the weights."
            )
        if self.embedding is not None and not self.embedding.built:
            self.embedding.build()
        self.own_tables, self.own_projections, self.biases = [], [], []
        for i in range(self.n_clusters):
            rows = self.bounds[i + 1] - self.bounds[i]
            width = self._width(i)
            table = None
            if not self.tie_weight and (self.div_val > 1 or i == 0):
                shape = (self.vocabulary_size if self.div_val == 1 else rows, width)
                table = self.add_weight(
                    name=f"cutoff_{i}_weight", shape=shape, initializer=weight_initializer(self.kernel_initializer)
                )
            self.own_tables.append(table)
            proj = None
            if not self.tie_projs[i]:
                skip = (self.div_val == 1 or not self.proj_same_dim) and width == self.hidden_dim
                if not skip:
                    proj = self.add_weight(
                        name=f"cutoff_{i}_proj",
                        shape=(width, self.hidden_dim),
                        initializer=weight_initializer(self.projection_initializer),
                    )
            self.own_projections.append(proj)
            self.biases.append(self.add_weight(name=f"cutoff_{i}_b", shape=(rows,), initializer="zeros"))
        if self.cutoffs:
            self.cluster_W = self.add_weight(
                name="cluster_W", shape=(len(self.cutoffs), self.embedding_dim), initializer="zeros"
            )
            self.cluster_b = self.add_weight(name="cluster_b", shape=(len(self.cutoffs),), initializer="zeros")
        self.built = True

    def cluster_weights(self, i):
        """`(table, bias, projection)` of cluster `i`; projection may be None."""
        if self.tie_weight:
            table = self.embedding.tables[0 if self.div_val == 1 else i]
        else:
            table = self.own_tables[0 if self.div_val == 1 else i]
        if self.tie_projs[i]:
            proj = self.embedding.projections[0 if self.div_val == 1 else i]
        else:
            proj = self.own_projections[i]
        return table, self.biases[i], proj

    def _cluster_blocks(self, i):
        """`cluster_weights(i)` with the cluster's rows of the table as a list of row
        blocks (`row_blocks`: no copy of a shared table on TensorFlow)."""
        table, bias, proj = self.cluster_weights(i)
        if self.div_val == 1 and self.cutoffs:
            return row_blocks(table, self.bounds[i], self.bounds[i + 1]), bias, proj
        return [table], bias, proj

    def _project(self, hidden, proj):
        x = ops.cast(hidden, self.compute_dtype)
        return x if proj is None else ops.matmul(x, ops.transpose(ops.cast(proj, self.compute_dtype)))

    def _logits_of(self, hidden, blocks, bias, proj):
        return self._projected_logits(self._project(hidden, proj), blocks, bias)

    def _projected_logits(self, x, blocks, bias):
        """float32 logits `(n, rows)` of projected rows `x` against row `blocks` and `bias`."""
        parts = [self._block_logits(x, ops.cast(block, self.compute_dtype)) for block in blocks]
        logits = ops.concatenate(parts, axis=-1) if len(parts) > 1 else parts[0]
        return ops.cast(logits, "float32") + ops.cast(bias, "float32")

    def _block_logits(self, x, block):
        """`x @ block^T`, `(n, rows)`. For a few rows of `x` against a large table (a tail
        cluster's tokens, a short segment) it is computed as `(block @ x^T)^T`: CPU GEMMs
        stream a tall table far better than they broadcast a few rows over it (4 tokens
        against a 160,000-word cluster: 8x faster)."""
        rows, width = block.shape
        plain = lambda: ops.matmul(x, ops.transpose(block))  # noqa: E731
        few = lambda: ops.transpose(ops.matmul(block, ops.transpose(x)))  # noqa: E731
        n = x.shape[0]
        if width < 128:  # narrow tables (div_val > 1 tails): the plain product is as fast
            return plain()
        if n is not None:
            return few() if n * FEW_ROWS <= rows else plain()
        if rows < FEW_ROWS * 512:  # not worth a branch
            return plain()
        return ops.cond(ops.shape(x)[0] * FEW_ROWS <= rows, few, plain)

    def _log_softmax_of(self, hidden, blocks, bias, proj):
        return ops.log_softmax(self._logits_of(hidden, blocks, bias, proj), axis=-1)

    def _nll_of(self, hidden, targets, blocks, bias, proj):
        # Its gradient is softmax - one_hot (`sparse_nll`); picking log-probs with
        # take_along_axis would cost a scatter over all logits instead.
        return sparse_nll(self._logits_of(hidden, blocks, bias, proj), targets)

    def _piece_rows(self, n):
        """Rows of the vocabulary per piece of `_lean_nll` for `n` rows of hidden states
        (None: unknown), a multiple of `PIECE_ALIGN`."""
        if n is None:
            return PIECE_ROWS
        return max(PIECE_ALIGN, PIECE_VALUES // max(n, 1) // PIECE_ALIGN * PIECE_ALIGN)

    def _lean_nll(self, i, hidden, targets, after=None):
        """Cluster `i`'s NLL of `targets` (columns of the cluster's logits, the head's
        tail columns included) without the logits of the whole cluster or a copy of its
        table (for wt103 at batch 8, the head's 82 MB logits and their softmax): the
        log-sum-exp is kept online over the vocabulary's pieces, the whole pieces by one
        loop (one piece's operations in the graph, not one set per piece: for wt103 at
        1,024 tokens ~4,000 graph operations and ~40 MB of the process's heap otherwise),
        then the rows left and, for the head, its tail-cluster logits. Each piece's
        logits wait for the previous piece's maximum (`_after`), so at most two pieces'
        logits exist at once (the first once `after` is computed)."""
        table, bias, proj = self.cluster_weights(i)
        x = self._project(hidden, proj)
        rows = self.bounds[i + 1] - self.bounds[i]
        base = self.bounds[i] if self.div_val == 1 else 0
        step = min(self._piece_rows(hidden.shape[0]), rows)
        whole = rows // step
        start_top = ops.full(ops.shape(targets), float("-inf"), "float32")
        state = (start_top if after is None else _after(start_top, after),
                 ops.zeros(ops.shape(targets), "float32"), ops.zeros(ops.shape(targets), "float32"))

        def add_piece(state, blocks, piece_bias, start):
            top, total, picked = state
            logits = self._projected_logits(_after(x, top), blocks, piece_bias)
            width = logits.shape[-1]
            # (with `initial`, no tokens is no error; kept dims: Keras's PyTorch max of no rows drops the axis)
            new_top = ops.maximum(top, ops.max(logits, axis=-1, keepdims=True, initial=float("-inf"))[:, 0])
            total = total * ops.exp(top - new_top) + ops.sum(ops.exp(logits - new_top[:, None]), axis=-1)
            local = targets - start
            value = ops.take_along_axis(logits, ops.clip(local, 0, width - 1)[:, None], axis=-1)[:, 0]
            return new_top, total, picked + ops.where(ops.logical_and(local >= 0, local < width), value, 0.0)

        if whole > 1:
            # A piece of the flat table: where its first row's offset is a multiple of 64
            # bytes TensorFlow shares the table's buffer (see `row_blocks`), else copies it.
            flat, width = ops.reshape(table, (-1,)), table.shape[-1]
            bias_values = ops.convert_to_tensor(bias)  # (JAX's loop takes arrays, not variables)

            def body(k, state):
                start = k * step
                block = ops.reshape(ops.slice(flat, ((base + start) * width,), (step * width,)), (step, width))
                return add_piece(state, [block], ops.slice(bias_values, (start,), (step,)), start)

            state = ops.fori_loop(0, whole, body, state)
        else:
            state = add_piece(state, row_blocks(table, base, base + step), bias[:step], 0)
        done = whole * step
        if done < rows:
            state = add_piece(state, row_blocks(table, base + done, base + rows), bias[done:], done)
        if i == 0 and self.cutoffs:
            state = add_piece(state, [self.cluster_W], self.cluster_b, rows)
        top, total, picked = state
        return top + ops.log(total) - picked

    def _head_weights(self):
        blocks, bias, proj = self._cluster_blocks(0)
        if self.cutoffs:
            blocks = [ops.concatenate(blocks + [self.cluster_W], axis=0)]
            bias = ops.concatenate([bias, self.cluster_b], axis=0)
        return blocks, bias, proj

    def _use_dense(self):
        if self.tail_mode == "auto":
            return keras.config.backend() == "jax"
        return self.tail_mode == "dense"

    def call(self, hidden, targets, training=None):
        out_shape = ops.shape(targets)
        hidden = ops.reshape(hidden, (-1, self.hidden_dim))
        targets = ops.reshape(ops.cast(targets, "int32"), (-1,))
        head_targets = targets
        for i in range(1, self.n_clusters):
            in_cluster = ops.logical_and(targets >= self.bounds[i], targets < self.bounds[i + 1])
            head_targets = ops.where(in_cluster, self.head_column(i), head_targets)
        # With gradients, `sparse_nll` (its gradient is softmax - one_hot, written out); without,
        # the vocabulary piece by piece, in a fraction of the memory.
        lean = training is False
        if lean:
            nll = self._lean_nll(0, hidden, head_targets)
        else:
            nll = self._nll_of(hidden, head_targets, *self._head_weights())
        for i in range(1, self.n_clusters):
            # (lean: the clusters one after the other too)
            nll = nll + self._tail_nll(i, hidden, targets, lean, after=nll if lean else None)
        return ops.reshape(nll, out_shape)

    def _tail_nll(self, i, hidden, targets, lean=False, after=None):
        low, high = self.bounds[i], self.bounds[i + 1]
        in_cluster = ops.logical_and(targets >= low, targets < high)

        def nll_of(rows, local):
            if lean:
                return self._lean_nll(i, rows, local, after)
            return self._nll_of(rows, local, *self._cluster_blocks(i))

        if self._use_dense():
            tail = nll_of(hidden, ops.clip(targets - low, 0, high - low - 1))
            return ops.where(in_cluster, tail, ops.zeros_like(tail))
        index = ops.cast(ops.nonzero(in_cluster)[0], "int32")
        tail = nll_of(ops.take(hidden, index, axis=0), ops.take(targets, index) - low)
        return ops.scatter(index[:, None], tail, ops.shape(targets))

    def _one_table(self):
        """Whether every cluster is a row range of one table seen through one projection."""
        return self.div_val == 1 and bool(self.cutoffs) and \
            len({id(self.cluster_weights(i)[2]) for i in range(self.n_clusters)}) == 1

    def log_probs(self, hidden):
        """Full log-probabilities, float32 `(..., vocabulary_size)`, summing to one."""
        lead = ops.shape(hidden)[:-1]
        flat = ops.reshape(hidden, (-1, self.hidden_dim))
        if self._one_table():
            # All logits by one product with the whole table, then split: no slices of the
            # table (XLA copies them; 439 MB per call for wt103's).
            table, _, proj = self.cluster_weights(0)
            x = self._project(flat, proj)
            logits = ops.cast(self._block_logits(x, ops.cast(table, self.compute_dtype)), "float32")
            clusters = [logits[:, low:high] + ops.cast(self.biases[i], "float32")
                        for i, (low, high) in enumerate(zip(self.bounds, self.bounds[1:]))]
            cluster_logits = ops.cast(ops.matmul(x, ops.transpose(ops.cast(self.cluster_W, self.compute_dtype))),
                                      "float32") + ops.cast(self.cluster_b, "float32")
            head = ops.log_softmax(ops.concatenate([clusters[0], cluster_logits], axis=-1), axis=-1)
            tails = [ops.log_softmax(tail, axis=-1) for tail in clusters[1:]]
        else:
            head = self._log_softmax_of(flat, *self._head_weights())
            tails = [self._log_softmax_of(flat, *self._cluster_blocks(i)) for i in range(1, self.n_clusters)]
        parts = [head[:, : self.bounds[1]]]
        for i, tail in enumerate(tails, start=1):
            column = self.head_column(i)
            parts.append(head[:, column : column + 1] + tail)
        full = ops.concatenate(parts, axis=-1) if len(parts) > 1 else parts[0]
        return ops.reshape(full, tuple(lead) + (self.vocabulary_size,))

    def compute_output_shape(self, hidden_shape, targets_shape=None):
        return tuple(hidden_shape[:-1])

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "vocabulary_size": self.vocabulary_size,
                "embedding_dim": self.embedding_dim,
                "hidden_dim": self.hidden_dim,
                "cutoffs": self.cutoffs,
                "div_val": self.div_val,
                "tie_weight": self.tie_weight,
                "tie_projs": self.tie_projs,
                "proj_same_dim": self.proj_same_dim,
                "cluster_order": self.cluster_order,
                "tail_mode": self.tail_mode,
                "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
                "projection_initializer": keras.initializers.serialize(self.projection_initializer),
            }
        )
        return config
