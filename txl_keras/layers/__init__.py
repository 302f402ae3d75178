"""Keras 3 layers of Transformer-XL (keras.ops only: TensorFlow, JAX and PyTorch).

Importing the package imports no Keras: each name loads its module on first use.
"""

import importlib

# public name -> the module that holds it
_HOMES = {
    "AdaptiveEmbedding": "adaptive_embedding",
    "AdaptiveSoftmax": "adaptive_softmax",
    "CacheStore": "inference_cache",
    "InferenceCache": "inference_cache",
    "LayerNorm": "layer_norm",
    "MemoryCache": "memory_cache",
    "PositionalEmbedding": "positional_embedding",
    "PositionwiseFeedForward": "positionwise_feed_forward",
    "RelativeAttention": "relative_attention",
    "ReplicaDropout": "replica_dropout",
    "ReplicaSeedGenerator": "replica_dropout",
    "TransformerXLBlock": "transformer_xl_block",
    "causal_attention_mask": "attention_mask",
    "relative_positions": "positional_embedding",
}

__all__ = sorted(_HOMES)


def __getattr__(name):
    if name in _HOMES:
        return getattr(importlib.import_module(f"txl_keras.layers.{_HOMES[name]}"), name)
    raise AttributeError(f"module 'txl_keras.layers' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(__all__))
