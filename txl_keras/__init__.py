"""txl_keras: Transformer-XL (Dai et al., 2019) for Keras 3 and TensorFlow 2."""

from txl_keras import layers
from txl_keras.models import PRESETS, TransformerXL, TransformerXLConfig, TransformerXLLM

__version__ = "0.1.0"

__all__ = ["PRESETS", "TransformerXL", "TransformerXLConfig", "TransformerXLLM", "layers"]
