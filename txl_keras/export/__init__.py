"""SavedModel export (`export_saved_model`): `txl_keras.export.saved_model`.

Importing the package imports nothing heavy (so that `python -m txl_keras.export` starts
quietly): each name loads `txl_keras.export.saved_model` on first use.
"""

import importlib


def __getattr__(name):
    module = importlib.import_module("txl_keras.export.saved_model")
    try:
        return getattr(module, name)
    except AttributeError:
        raise AttributeError(f"module 'txl_keras.export' has no attribute {name!r}") from None


def __dir__():
    return sorted(set(globals()) | set(dir(importlib.import_module("txl_keras.export.saved_model"))))
