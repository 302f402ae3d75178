"""Adaptive input representations (Baevski & Auli, 2019) as used by Transformer-XL."""

import keras
from keras import ops

from txl_keras.layers import quantization
from txl_keras.layers.adaptive_clusters import check_cutoffs, cluster_bounds
from txl_keras.layers.weight_initializers import weight_initializer


@keras.saving.register_keras_serializable(package="txl_keras")
class AdaptiveEmbedding(quantization.QuantizableLayer, keras.layers.Layer):
    """Token embedding with a smaller width for rarer clusters of the vocabulary.

    The vocabulary is split at `cutoffs` into clusters; cluster `i` has its own table of
    width `embedding_dim // div_val**i`, projected (no bias) to `hidden_dim`. With
    `div_val == 1` there is one table `(vocabulary_size, embedding_dim)` and one
    projection, present only when `embedding_dim != hidden_dim`. With `div_val > 1`
    every cluster has a projection, except one whose width already equals `hidden_dim`
    when `proj_same_dim` is False (the lm1b setting). The result is multiplied by
    `sqrt(hidden_dim)` (the projection width, not `embedding_dim`), as in the original.

    The tables and projections are `tables[i]` and `projections[i]` (`None` where
    absent); `AdaptiveSoftmax` ties its output weights to them. `quantize("int8")` makes
    the tables int8 with a scale per row (`table_scales[i]`, None while float; the
    projections, `d_embed`-wide at most, stay float).

    Args:
        vocabulary_size: int, `n_token`.
        embedding_dim: int, `d_embed`.
        hidden_dim: int, `d_model`.
        cutoffs: increasing ints in `(0, vocabulary_size)`.
        div_val: int >= 1.
        proj_same_dim: bool.
        embeddings_initializer: initializer of the tables.
        projection_initializer: initializer of the projections.
        **kwargs: base layer arguments (`name`, `dtype`).

    Call arguments:
        tokens: int tensor `(batch_size, T)` with ids in `[0, vocabulary_size)`.

    Returns:
        `(batch_size, T, hidden_dim)`.

    Example:
    >>> layer = AdaptiveEmbedding(10, 8, 8, cutoffs=[4, 7], div_val=2)
    >>> tuple(layer(ops.array([[1, 5, 9]])).shape)
    (1, 3, 8)

    References:
        Baevski & Auli, "Adaptive Input Representations for Neural Language Modeling",
        ICLR 2019.
    """

    def __init__(
        self,
        vocabulary_size,
        embedding_dim,
        hidden_dim,
        cutoffs=(),
        div_val=1,
        proj_same_dim=True,
        embeddings_initializer="uniform",
        projection_initializer="glorot_uniform",
        **kwargs,
    ):
        super().__init__(**kwargs)
        check_cutoffs(vocabulary_size, cutoffs, embedding_dim, div_val, hidden_dim, type(self).__name__)
        self.vocabulary_size = vocabulary_size
        self.embedding_dim = embedding_dim
        self.hidden_dim = hidden_dim
        self.cutoffs = list(cutoffs)
        self.div_val = div_val
        self.proj_same_dim = proj_same_dim
        self.embeddings_initializer = keras.initializers.get(embeddings_initializer)
        self.projection_initializer = keras.initializers.get(projection_initializer)
        self.bounds = cluster_bounds(vocabulary_size, cutoffs)

    def cluster_width(self, i):
        """The table width of cluster `i`."""
        return self.embedding_dim if self.div_val == 1 else self.embedding_dim // self.div_val**i

    def build(self, tokens_shape=None):
        self.tables, self.projections = [], []
        self.table_scales = []
        if self.div_val == 1:
            self.tables.append(self._table("lookup_table", self.vocabulary_size, self.embedding_dim))
            needs_proj = self.embedding_dim != self.hidden_dim
            self.projections.append(self._proj("proj_W", self.embedding_dim) if needs_proj else None)
        else:
            for i in range(len(self.bounds) - 1):
                width = self.cluster_width(i)
                rows = self.bounds[i + 1] - self.bounds[i]
                self.tables.append(self._table(f"cutoff_{i}_lookup_table", rows, width))
                skip = width == self.hidden_dim and not self.proj_same_dim
                self.projections.append(None if skip else self._proj(f"cutoff_{i}_proj_W", width))
        self.table_scales = [None] * len(self.tables)
        self.built = True
        self._quantize_if_policy_says()

    def _to_int8(self):
        """Every table as int8 values with a scale per row (`layers.quantization`)."""
        quantized = [quantization.to_int8(self, table) for table in self.tables]
        self.tables = [values for values, _ in quantized]
        self.table_scales = [scale for _, scale in quantized]

    def _table(self, name, rows, width):
        return self.add_weight(
            name=name, shape=(rows, width), initializer=weight_initializer(self.embeddings_initializer)
        )

    def _proj(self, name, width):
        return self.add_weight(
            name=name, shape=(width, self.hidden_dim), initializer=weight_initializer(self.projection_initializer)
        )

    def call(self, tokens):
        tokens = ops.cast(tokens, "int32")
        scale = self.hidden_dim**0.5
        if self.div_val == 1:
            embedded = quantization.take_rows(self.tables[0], tokens, self.table_scales[0])
            if self.projections[0] is not None:
                embedded = ops.matmul(embedded, self.projections[0])
            return ops.cast(embedded, self.compute_dtype) * scale
        # One product for all clusters: each token's row, in its own cluster's columns
        # (zeros in the others), the clusters side by side, times the projections stacked
        # `(sum of widths, hidden_dim)` (a product per cluster, selected and summed, passes
        # over `(batch_size, T, hidden_dim)` twice more per cluster each way).
        projected, projections, unprojected = [], [], None
        for i, (table, proj) in enumerate(zip(self.tables, self.projections)):
            low, high = self.bounds[i], self.bounds[i + 1]
            in_cluster = ops.logical_and(tokens >= low, tokens < high)
            part = quantization.take_rows(table, ops.clip(tokens - low, 0, high - low - 1), self.table_scales[i])
            part = part * ops.cast(in_cluster, part.dtype)[..., None]
            if proj is None:  # a width of hidden_dim without proj_same_dim: used as it is
                unprojected = part
            else:
                projected.append(part)
                projections.append(proj)
        embedded = unprojected
        if projected:
            embedded = ops.matmul(ops.concatenate(projected, axis=-1), ops.concatenate(projections, axis=0))
            if unprojected is not None:
                embedded = embedded + unprojected
        return ops.cast(embedded, self.compute_dtype) * scale

    def _built_projections(self):
        """Which clusters have a projection (builds the layer if needed)."""
        if not self.built:
            self.build()
        return [p is not None for p in self.projections]

    def compute_output_shape(self, tokens_shape):
        return tuple(tokens_shape) + (self.hidden_dim,)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "vocabulary_size": self.vocabulary_size,
                "embedding_dim": self.embedding_dim,
                "hidden_dim": self.hidden_dim,
                "cutoffs": self.cutoffs,
                "div_val": self.div_val,
                "proj_same_dim": self.proj_same_dim,
                "embeddings_initializer": keras.initializers.serialize(self.embeddings_initializer),
                "projection_initializer": keras.initializers.serialize(self.projection_initializer),
            }
        )
        return config
