"""The shared training loop, optimizer, schedules, checkpoints and evaluation.

Importing the package imports nothing heavy (so that
`python -m txl_keras.training.average_checkpoints` starts quietly): each name below loads
its module on first use.
"""

import importlib

_HOMES = {
    "NonFiniteLossError": "txl_keras.training.trainer",
    "RUN_PRESETS": "txl_keras.training.train_config",
    "TrainConfig": "txl_keras.training.train_config",
    "Trainer": "txl_keras.training.trainer",
    "latest_checkpoint": "txl_keras.run_folder",
    "learning_rate": "txl_keras.schedules",
    "list_checkpoints": "txl_keras.run_folder",
    "save_checkpoint": "txl_keras.run_folder",
}

__all__ = sorted(_HOMES)


def __getattr__(name):
    if name in _HOMES:
        return getattr(importlib.import_module(_HOMES[name]), name)
    raise AttributeError(f"module 'txl_keras.training' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(__all__))
