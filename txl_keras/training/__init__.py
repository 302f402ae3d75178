"""The shared training loop, optimizer, schedules, checkpoints and evaluation."""

from txl_keras.run_folder import latest_checkpoint, list_checkpoints, save_checkpoint
from txl_keras.training.schedule import learning_rate
from txl_keras.training.train_config import RUN_PRESETS, TrainConfig
from txl_keras.training.trainer import NonFiniteLossError, Trainer

__all__ = [
    "NonFiniteLossError",
    "RUN_PRESETS",
    "TrainConfig",
    "Trainer",
    "latest_checkpoint",
    "learning_rate",
    "list_checkpoints",
    "save_checkpoint",
]
