"""Transformer-XL models: config and presets, backbone, language model."""

from txl_keras.models.config import PRESETS, TransformerXLConfig
from txl_keras.models.transformer_xl import TransformerXL
from txl_keras.models.transformer_xl_lm import TransformerXLLM

__all__ = ["PRESETS", "TransformerXL", "TransformerXLConfig", "TransformerXLLM"]
