"""Keras 3 layers of Transformer-XL (keras.ops only: TensorFlow, JAX and PyTorch).

Importing the package imports no Keras: each name loads its module on first use.
"""

from txl_io.lazy_names import lazy_names

# public name -> the module that holds it
_HOMES = {
    "AdaptiveEmbedding": "txl_keras.layers.adaptive_embedding",
    "AdaptiveSoftmax": "txl_keras.layers.adaptive_softmax",
    "CacheStore": "txl_keras.layers.inference_cache",
    "InferenceCache": "txl_keras.layers.inference_cache",
    "LayerNorm": "txl_keras.layers.layer_norm",
    "MemoryCache": "txl_keras.layers.memory_cache",
    "PositionalEmbedding": "txl_keras.layers.positional_embedding",
    "PositionwiseFeedForward": "txl_keras.layers.positionwise_feed_forward",
    "RelativeAttention": "txl_keras.layers.relative_attention",
    "ReplicaDropout": "txl_keras.layers.replica_dropout",
    "ReplicaSeedGenerator": "txl_keras.layers.replica_dropout",
    "TransformerXLBlock": "txl_keras.layers.transformer_xl_block",
    "causal_attention_mask": "txl_keras.layers.attention_mask",
    "relative_positions": "txl_keras.layers.positional_embedding",
}

__getattr__, __dir__, __all__ = lazy_names(__name__, _HOMES)
