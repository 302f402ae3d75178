"""The original Transformer-XL weights loaded (`from_tf_checkpoint`, `from_pytorch_state_dict`):
`txl_keras.convert.checkpoints`.

Importing the package imports nothing heavy (so that `python -m txl_keras.convert` starts
quietly): each name loads `txl_keras.convert.checkpoints` on first use.
"""

import importlib


def __getattr__(name):
    module = importlib.import_module("txl_keras.convert.checkpoints")
    try:
        return getattr(module, name)
    except AttributeError:
        raise AttributeError(f"module 'txl_keras.convert' has no attribute {name!r}") from None


def __dir__():
    return sorted(set(globals()) | set(dir(importlib.import_module("txl_keras.convert.checkpoints"))))
