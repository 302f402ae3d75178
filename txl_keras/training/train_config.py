"""`TrainConfig`: the training and evaluation settings of one run."""

import dataclasses

PRECISIONS = ("float32", "mixed_bfloat16", "mixed_float16")


@dataclasses.dataclass
class TrainConfig:
    """Settings of the shared training loop (named as the original flags).

    Batch sizes are per host, as in the original; each replica gets
    `batch_size // num_core_per_host` streams.
    """

    model_dir: str
    records_dir: str
    train_batch_size: int = 60
    eval_batch_size: int = 60
    learning_rate: float = 2.5e-4
    lr_schedule: str = "cosine"
    warmup_steps: int = 0
    train_steps: int = 100000
    min_lr_ratio: float = 0.004
    clip: float = 0.25
    batch_chunk: int = 1
    iterations: int = 200
    save_steps: int = 1000
    keep_checkpoint_max: int = 5
    precision: str = "float32"
    xla: bool = False
    seed: int = 1111
    deterministic: bool = True
    warm_start_path: str = None
    skip_nonfinite: bool = False
    eval_split: str = "valid"
    eval_tgt_len: int = None
    eval_mem_len: int = None
    eval_clamp_len: int = None
    eval_same_length: bool = None
    max_eval_batch: int = -1

    def __post_init__(self):
        if self.precision not in PRECISIONS:
            raise ValueError(f"Expected `precision` in {PRECISIONS}. Received: {self.precision!r}")
        for name in ("train_batch_size", "eval_batch_size", "train_steps", "iterations", "batch_chunk"):
            if getattr(self, name) <= 0:
                raise ValueError(f"Expected `{name}` to be positive. Received: {name}={getattr(self, name)}")
        if self.train_batch_size % self.batch_chunk:
            raise ValueError(
                f"`batch_chunk`={self.batch_chunk} must divide the per-replica batch; "
                f"train_batch_size={self.train_batch_size}."
            )
