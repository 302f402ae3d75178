"""The shared training loop, optimizer, schedules, checkpoints and evaluation.

Importing the package imports nothing heavy (so that
`python -m txl_keras.training.average_checkpoints` starts quietly): each name below loads
its module on first use.
"""

from txl_io.lazy_names import lazy_names

# public name -> the module that holds it
_HOMES = {
    "NonFiniteLossError": "txl_keras.training.loop",
    "RUN_PRESETS": "txl_keras.training.train_config",
    "TrainConfig": "txl_keras.training.train_config",
    "Trainer": "txl_keras.training.trainer",
    "latest_checkpoint": "txl_keras.run_folder",
    "learning_rate": "txl_keras.schedules",
    "list_checkpoints": "txl_keras.run_folder",
    "save_checkpoint": "txl_keras.run_folder",
}

__getattr__, __dir__, __all__ = lazy_names(__name__, _HOMES)
