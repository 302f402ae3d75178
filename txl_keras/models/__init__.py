"""Transformer-XL models: config and presets, backbone, language model.

Importing the package imports no Keras: each name loads its module on first use.
"""

from txl_io.lazy_names import lazy_names

# public name -> the module that holds it
_HOMES = {
    "PRESETS": "txl_keras.models.config",
    "TransformerXLConfig": "txl_keras.models.config",
    "TransformerXL": "txl_keras.models.transformer_xl",
    "TransformerXLLM": "txl_keras.models.transformer_xl_lm",
}

__getattr__, __dir__, __all__ = lazy_names(__name__, _HOMES)
