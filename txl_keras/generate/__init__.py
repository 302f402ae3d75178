"""Generation and scoring (`generate`, `stream`, `score`): `txl_keras.generate.loop`.

Importing the package imports nothing heavy (so that `python -m txl_keras.generate` starts
quietly): each name loads `txl_keras.generate.loop` on first use.
"""

import importlib


def __getattr__(name):
    module = importlib.import_module("txl_keras.generate.loop")
    try:
        return getattr(module, name)
    except AttributeError:
        raise AttributeError(f"module 'txl_keras.generate' has no attribute {name!r}") from None


def __dir__():
    return sorted(set(globals()) | set(dir(importlib.import_module("txl_keras.generate.loop"))))
