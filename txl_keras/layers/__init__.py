"""Keras 3 layers of Transformer-XL (keras.ops only: TensorFlow, JAX and PyTorch)."""

from txl_keras.layers.adaptive_embedding import AdaptiveEmbedding
from txl_keras.layers.adaptive_softmax import AdaptiveSoftmax
from txl_keras.layers.attention_mask import causal_attention_mask
from txl_keras.layers.inference_cache import CacheStore, InferenceCache
from txl_keras.layers.layer_norm import LayerNorm
from txl_keras.layers.memory_cache import MemoryCache
from txl_keras.layers.positional_embedding import PositionalEmbedding, relative_positions
from txl_keras.layers.positionwise_feed_forward import PositionwiseFeedForward
from txl_keras.layers.relative_attention import RelativeAttention
from txl_keras.layers.replica_dropout import ReplicaDropout, ReplicaSeedGenerator
from txl_keras.layers.transformer_xl_block import TransformerXLBlock

__all__ = [
    "AdaptiveEmbedding",
    "AdaptiveSoftmax",
    "CacheStore",
    "InferenceCache",
    "LayerNorm",
    "MemoryCache",
    "PositionalEmbedding",
    "PositionwiseFeedForward",
    "RelativeAttention",
    "ReplicaDropout",
    "ReplicaSeedGenerator",
    "TransformerXLBlock",
    "causal_attention_mask",
    "relative_positions",
]
