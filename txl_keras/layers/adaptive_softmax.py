"""Adaptive softmax (Grave et al., 2017) with the projections of Transformer-XL."""

import keras
from keras import ops

from txl_keras import kernels
from txl_keras.kernels import int8
from txl_keras.kernels import nll as nll_kernels
from txl_keras.kernels import tables
from txl_keras.layers import quantization
from txl_keras.layers.adaptive_clusters import check_cutoffs, cluster_bounds
from txl_keras.layers.weight_initializers import weight_initializer

CLUSTER_ORDERS = ("tf", "pytorch")
TAIL_MODES = ("auto", "gather", "dense")


@keras.saving.register_keras_serializable(package="txl_keras")
class AdaptiveSoftmax(quantization.QuantizableLayer, keras.layers.Layer):
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

    `quantize("int8")` makes the untied tables int8 with a scale per row (a tied table is
    the embedding's, quantized with it: quantize the embedding first); a cluster's logits
    are then `((h @ P_i^T) @ q_i^T) / scale_i + b_i`. Projections and biases stay float.

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
            vocabulary in pieces (`kernels.nll.streamed_nll`) instead of whole clusters.

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
        check_cutoffs(vocabulary_size, cutoffs, embedding_dim, div_val, hidden_dim, type(self).__name__)
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
        self.own_table_scales = [None] * len(self.own_tables)
        self.built = True
        self._quantize_if_policy_says()

    def _to_int8(self):
        """The untied tables as int8 values with a scale per row (`layers.quantization`)."""
        if self.tie_weight and self.embedding.quantization_mode != "int8":
            raise ValueError("AdaptiveSoftmax's tables are tied to an AdaptiveEmbedding: quantize the embedding "
                             "first (the models' quantize() does both).")
        for i, table in enumerate(self.own_tables):
            if table is not None:
                self.own_tables[i], self.own_table_scales[i] = quantization.to_int8(self, table)

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

    def table_scale(self, i):
        """The per-row scale `(table rows,)` of the int8 table `cluster_weights(i)` holds
        (the whole table's with `div_val == 1`), None while float."""
        j = 0 if self.div_val == 1 else i
        return self.embedding.table_scales[j] if self.tie_weight else self.own_table_scales[j]

    def _cluster_scale(self, i):
        """`table_scale(i)` of the cluster's own rows `(rows,)`, None while float."""
        scale = self.table_scale(i)
        if scale is None or not (self.div_val == 1 and self.cutoffs):
            return scale
        return scale[self.bounds[i]:self.bounds[i + 1]]

    def _cluster_blocks(self, i):
        """`cluster_weights(i)` with the cluster's rows of the table as a list of row
        blocks (`row_blocks`: no copy of a shared table on TensorFlow), and the rows' scale."""
        table, bias, proj = self.cluster_weights(i)
        if self.div_val == 1 and self.cutoffs:
            blocks = tables.row_blocks if kernels.fast_kernels_enabled() else tables.row_blocks_reference
            return blocks(table, self.bounds[i], self.bounds[i + 1]), bias, proj, self._cluster_scale(i)
        return [table], bias, proj, self._cluster_scale(i)

    def _project(self, hidden, proj):
        x = ops.cast(hidden, self.compute_dtype)
        return x if proj is None else ops.matmul(x, ops.transpose(ops.cast(proj, self.compute_dtype)))

    def _logits_of(self, hidden, blocks, bias, proj, scale=None):
        """float32 logits `(n, rows)` of hidden rows `(n, hidden_dim)` against a cluster's
        row `blocks`, `bias` and projection (and the rows' `scale` of int8 blocks)."""
        x = self._project(hidden, proj)
        if kernels.fast_kernels_enabled():
            return nll_kernels.table_logits(x, blocks, bias, scale)
        blocks = [ops.cast(block, self.compute_dtype) for block in blocks]
        table = ops.concatenate(blocks, axis=0) if len(blocks) > 1 else blocks[0]
        logits = ops.cast(tables.rows_times_table_reference(x, table), "float32")
        return (logits if scale is None else logits / ops.cast(scale, "float32")) + ops.cast(bias, "float32")

    def _times_table(self, x, table):
        """`x @ table^T` with the whole table (`log_probs`): a few rows take its row pieces."""
        if not kernels.fast_kernels_enabled():
            return tables.rows_times_table_reference(x, ops.cast(table, self.compute_dtype))
        if table.dtype == "int8":
            return int8.times_rows(x, table)
        return tables.rows_times_table(x, ops.cast(table, self.compute_dtype), pieces=True)

    def _log_softmax_of(self, hidden, blocks, bias, proj, scale=None):
        return ops.log_softmax(self._logits_of(hidden, blocks, bias, proj, scale), axis=-1)

    def _nll_of(self, hidden, targets, blocks, bias, proj, scale=None):
        nll = kernels.sparse_nll if kernels.fast_kernels_enabled() else kernels.sparse_nll_reference
        return nll(self._logits_of(hidden, blocks, bias, proj, scale), targets)

    def _streamed_nll(self, i, hidden, targets, wait_for=None):
        """Cluster `i`'s NLL of `targets` (columns of its logits, the head's tail-cluster
        columns included) streamed over its table (`kernels.nll.streamed_nll`): without
        the logits of the whole cluster or a copy of its table."""
        table, bias, proj = self.cluster_weights(i)
        low = self.bounds[i] if self.div_val == 1 else 0
        extra = (self.cluster_W, self.cluster_b) if i == 0 and self.cutoffs else None
        return nll_kernels.streamed_nll(self._project(hidden, proj), table, bias, targets, low,
                                        self.bounds[i + 1] - self.bounds[i], extra, wait_for, self._cluster_scale(i))

    def _head_weights(self):
        blocks, bias, proj, scale = self._cluster_blocks(0)
        if self.cutoffs:
            if scale is None:
                blocks = [ops.concatenate(blocks + [self.cluster_W], axis=0)]
            else:  # the float tail-cluster rows beside the int8 ones, scale 1
                blocks = blocks + [self.cluster_W]
                scale = ops.concatenate([ops.cast(scale, "float32"), ops.ones((len(self.cutoffs),), "float32")])
            bias = ops.concatenate([bias, self.cluster_b], axis=0)
        return blocks, bias, proj, scale

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
        # Without gradients (training=False) and with the fast kernels, each cluster's NLL is
        # streamed over its table, one cluster after the other, in a fraction of the memory.
        streamed = training is False and kernels.fast_kernels_enabled()
        if streamed:
            nll = self._streamed_nll(0, hidden, head_targets)
        else:
            nll = self._nll_of(hidden, head_targets, *self._head_weights())
        for i in range(1, self.n_clusters):
            nll = nll + self._tail_nll(i, hidden, targets, streamed, wait_for=nll if streamed else None)
        return ops.reshape(nll, out_shape)

    def _tail_nll(self, i, hidden, targets, streamed=False, wait_for=None):
        low, high = self.bounds[i], self.bounds[i + 1]
        in_cluster = ops.logical_and(targets >= low, targets < high)

        def nll_of(rows, local):
            if streamed:
                return self._streamed_nll(i, rows, local, wait_for)
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
            # table (XLA copies them).
            table, _, proj = self.cluster_weights(0)
            x = self._project(flat, proj)
            logits = ops.cast(self._times_table(x, table), "float32")
            if self.table_scale(0) is not None:
                logits = logits / ops.cast(self.table_scale(0), "float32")
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
