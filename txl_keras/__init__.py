"""txl_keras: Transformer-XL (Dai et al., 2019) for Keras 3 and TensorFlow 2.

`import txl_keras` loads the layers, the models, the tokenizer and the text task
(`TransformerXLCausalLM`: text in, text out, `fit` on text, presets); the rest is reached
lazily on first use: `txl_keras.training`, `txl_keras.export` /
`txl_keras.export_saved_model`, `txl_keras.generate` (the module;
`txl_keras.generate.generate` the function), `txl_keras.convert`, `txl_keras.run_folder`,
`txl_keras.presets` (names and folders -> config, weights and vocabulary).

Importing it calls `txl_keras.tf_backend.install()`: TensorFlow's BFC CPU allocator is
selected (unless the environment sets `TF_CPU_ALLOCATOR_USE_BFC`), and on the TensorFlow
backend the layers get TensorFlow's replica id, dropout bits and whole-table draws.
"""

import importlib

from txl_io import startup

startup.quiet_tensorflow()  # the programs (python -m txl_keras.*) start quietly

from txl_keras import tf_backend  # noqa: E402

tf_backend.install()  # before TensorFlow makes its CPU device

from txl_keras import kernels, layers  # noqa: E402
from txl_keras.models import PRESETS, TransformerXL, TransformerXLConfig, TransformerXLLM  # noqa: E402
from txl_keras.tokenizers import TransformerXLTokenizer  # noqa: E402
from txl_keras.tasks import TransformerXLCausalLM, TransformerXLCausalLMPreprocessor  # noqa: E402

__version__ = "0.1.0"

_LAZY_MODULES = ("convert", "export", "generate", "presets", "run_folder", "training")
_LAZY_NAMES = {"export_saved_model": "export", "load_trained_model": "run_folder"}

__all__ = ["PRESETS", "TransformerXL", "TransformerXLCausalLM", "TransformerXLCausalLMPreprocessor",
           "TransformerXLConfig", "TransformerXLLM", "TransformerXLTokenizer", "kernels", "layers",
           *_LAZY_MODULES, *_LAZY_NAMES]


def __getattr__(name):
    if name in _LAZY_MODULES:
        return importlib.import_module(f"txl_keras.{name}")
    if name in _LAZY_NAMES:
        return getattr(importlib.import_module(f"txl_keras.{_LAZY_NAMES[name]}"), name)
    raise AttributeError(f"module 'txl_keras' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(__all__))
