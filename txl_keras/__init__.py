"""txl_keras: Transformer-XL (Dai et al., 2019) for Keras 3 and TensorFlow 2.

`import txl_keras` loads the layers and models; the rest is reached lazily on first use:
`txl_keras.training`, `txl_keras.export` / `txl_keras.export_saved_model`,
`txl_keras.generate` (the module; `txl_keras.generate.generate` the function),
`txl_keras.convert`, `txl_keras.run_folder`.
"""

import importlib

from txl_keras.cpu_allocator import prefer_bfc_cpu_allocator

prefer_bfc_cpu_allocator()  # before TensorFlow makes its CPU device (see the module)

import keras  # noqa: E402

from txl_keras import layers  # noqa: E402
from txl_keras.models import PRESETS, TransformerXL, TransformerXLConfig, TransformerXLLM  # noqa: E402

if keras.backend.backend() == "tensorflow":
    importlib.import_module("txl_keras.tf_replicas")  # each tf.distribute replica draws its own dropout masks
    importlib.import_module("txl_keras.tf_whole_draw")  # large tables drawn without extra copies
    importlib.import_module("txl_keras.tf_random_bits")  # dropout: two units' bits per Philox word

__version__ = "0.1.0"

_LAZY_MODULES = ("convert", "export", "generate", "run_folder", "training")
_LAZY_NAMES = {"export_saved_model": "export", "load_trained_model": "run_folder"}

__all__ = ["PRESETS", "TransformerXL", "TransformerXLConfig", "TransformerXLLM", "layers",
           *_LAZY_MODULES, *_LAZY_NAMES]


def __getattr__(name):
    if name in _LAZY_MODULES:
        return importlib.import_module(f"txl_keras.{name}")
    if name in _LAZY_NAMES:
        return getattr(importlib.import_module(f"txl_keras.{_LAZY_NAMES[name]}"), name)
    raise AttributeError(f"module 'txl_keras' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(__all__))
