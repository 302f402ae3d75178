"""Transformer-XL models: config and presets, backbone, language model.

Importing the package imports no Keras: each name loads its module on first use.
"""

import importlib

# public name -> the module that holds it
_HOMES = {
    "PRESETS": "config",
    "TransformerXLConfig": "config",
    "TransformerXL": "transformer_xl",
    "TransformerXLLM": "transformer_xl_lm",
}

__all__ = sorted(_HOMES)


def __getattr__(name):
    if name in _HOMES:
        return getattr(importlib.import_module(f"txl_keras.models.{_HOMES[name]}"), name)
    raise AttributeError(f"module 'txl_keras.models' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(__all__))
