"""The adaptive layers' clusters: the vocabulary split at `cutoffs` (plain Python, no Keras)."""

from txl_keras.layers import arguments


def cluster_bounds(vocabulary_size, cutoffs):
    """`[0, *cutoffs, vocabulary_size]`: cluster `i` holds ids in `[b[i], b[i + 1])`."""
    return [0] + list(cutoffs) + [vocabulary_size]


def check_cutoffs(vocabulary_size, cutoffs, embedding_dim, div_val, hidden_dim=1, layer="AdaptiveEmbedding"):
    """Raise a clear ValueError unless the adaptive settings are consistent."""
    for name, value in (("vocabulary_size", vocabulary_size), ("embedding_dim", embedding_dim),
                        ("hidden_dim", hidden_dim)):
        arguments.positive_int(layer, name, value)
    bounds = cluster_bounds(vocabulary_size, cutoffs)
    if any(b <= a for a, b in zip(bounds, bounds[1:])):
        raise ValueError(
            "Expected `cutoffs` to be strictly increasing integers in (0, n_token). "
            f"Received: cutoffs={list(cutoffs)} with n_token={vocabulary_size}"
        )
    if not isinstance(div_val, int) or div_val < 1:
        raise ValueError(f"Expected `div_val` to be an integer >= 1. Received: div_val={div_val}")
    if div_val > 1:
        deepest = div_val ** len(cutoffs)
        if embedding_dim % deepest:
            raise ValueError(
                f"Expected `d_embed` to be divisible by div_val**{len(cutoffs)}={deepest} so "
                f"every cluster has an integer width. Received: d_embed={embedding_dim}, "
                f"div_val={div_val}, cutoffs={list(cutoffs)}"
            )
