"""`TrainConfig`: the training and evaluation settings of one run, and run presets.

The dataclass is the one source of the defaults: the trainers' command-line flags are
derived from its fields (name, type, default and help), so a Python user and a
command-line user get the same run.
"""

import dataclasses

from txl_keras import optimizers

PRECISIONS = ("float32", "mixed_bfloat16", "mixed_float16")
LR_SCHEDULES = ("cosine", "inv_sqrt", "constant")
EVAL_SPLITS = ("valid", "test")
_KIND_NAMES = {bool: "a boolean (true/false, not a string)", int: "an integer", float: "a number", str: "a string"}


def _field(default, help, group, choices=None):
    """A setting: its default, the help of its flag, the flag's --help group, its choices."""
    return dataclasses.field(default=default, metadata={"help": help, "group": group, "choices": choices})


@dataclasses.dataclass
class TrainConfig:
    """Settings of the shared training loop (named as the original flags; defaults of
    the original scripts).

    Batch sizes are per host, as in the original; each replica gets
    `batch_size // num_core_per_host` streams.
    """

    model_dir: str = _field(None, "Run folder: config.json, checkpoints, summaries (any tf.io.gfile path).", "run")
    records_dir: str = _field(None, "Folder of the TFRecords (--data_dir on the command line).", "data")
    train_batch_size: int = _field(60, "Streams per host per step.", "training")
    eval_batch_size: int = _field(60, "Streams per host in evaluation.", "evaluation")
    learning_rate: float = _field(optimizers.LEARNING_RATE, "Peak learning rate (> 0).", "training")
    lr_schedule: str = _field("cosine", "Decay after warmup.", "training", LR_SCHEDULES)
    warmup_steps: int = _field(0, "Linear warmup steps (>= 0).", "training")
    train_steps: int = _field(100000, "Steps to train (>= 1).", "training")
    min_lr_ratio: float = _field(0.004, "Cosine decays to learning_rate * min_lr_ratio (in [0, 1]).", "training")
    clip: float = _field(optimizers.CLIP_NORM, "Clip gradients to this global norm (> 0; 0 switches clipping off).",
                         "training")
    batch_chunk: int = _field(1, "Split each replica's batch into this many chunks, run one after another "
                              "(gradient accumulation: one chunk's activations in memory at a time).", "training")
    concurrent_parts: int = _field(0, "Split each chunk into this many parts whose forward and backward passes "
                                   "run side by side (TensorFlow's inter-op threads; gradients summed); 0: 2 on "
                                   "CPUs when the steps are not XLA-compiled, TensorFlow has more than one "
                                   "inter-op thread (TF_NUM_INTEROP_THREADS) and the rows divide, else 1.",
                                   "speed and precision")
    iterations: int = _field(200, "Steps per host-loop call, and the logging interval.", "training")
    save_steps: int = _field(1000, "Save a checkpoint every this many steps (0: only at the end).", "checkpoints")
    keep_checkpoint_max: int = _field(5, "Checkpoints to keep (>= 1).", "checkpoints")
    precision: str = _field("float32", "Compute precision; mixed_bfloat16 on TPUs (loss and softmax stay "
                            "float32).", "speed and precision", PRECISIONS)
    xla: bool = _field(False, "XLA-compile the forward and backward pass (always on under TPUStrategy).",
                       "speed and precision")
    seed: int = _field(1111, "Random seed.", "training")
    deterministic: bool = _field(True, "Deterministic ops (needed for bit-exact resume).", "training")
    warm_start_path: str = _field(None, "Start from these weights (checkpoint folder or .weights.h5); "
                                  "not the optimizer or the step.", "training")
    skip_nonfinite: bool = _field(False, "Skip steps with a non-finite loss instead of stopping.", "training")
    eval_split: str = _field("valid", "Split to evaluate.", "evaluation", EVAL_SPLITS)
    eval_tgt_len: int = _field(None, "Evaluation segment length (default tgt_len).", "evaluation")
    eval_mem_len: int = _field(None, "Evaluation memory length (default mem_len).", "evaluation")
    eval_clamp_len: int = _field(None, "Evaluation clamp_len (default clamp_len).", "evaluation")
    eval_same_length: bool = _field(None, "Evaluation same_length (default same_length).", "evaluation")
    max_eval_batch: int = _field(-1, "Evaluate at most this many batches (-1: the whole split).", "evaluation")
    eval_xla: bool = _field(True, "XLA-compile evaluation's forward pass (always on under TPUStrategy).",
                            "evaluation")
    eval_steps: int = _field(0, "While training, evaluate on eval_split every this many steps and keep the "
                             "best weights by validation loss (0: evaluate only after training).", "evaluation")

    def __post_init__(self):
        self.validate()

    def _fail(self, name, expected):
        raise ValueError(f"Expected `{name}` to be {expected}. Received: {name}={getattr(self, name)!r}")

    def validate(self):
        for f in dataclasses.fields(self):
            value, kind = getattr(self, f.name), f.type
            if value is None:
                if f.default is not None:
                    self._fail(f.name, _KIND_NAMES[kind])
                continue
            ok = isinstance(value, bool) if kind is bool else (
                isinstance(value, kind) and not isinstance(value, bool) or
                (kind is float and isinstance(value, int) and not isinstance(value, bool)))
            if not ok:
                self._fail(f.name, _KIND_NAMES[kind])
            if f.metadata.get("choices") and value not in f.metadata["choices"]:
                self._fail(f.name, f"one of {f.metadata['choices']}")
        for name in ("train_batch_size", "eval_batch_size", "train_steps", "iterations", "batch_chunk",
                     "keep_checkpoint_max"):
            if getattr(self, name) < 1:
                self._fail(name, "a positive integer")
        for name in ("warmup_steps", "save_steps", "eval_steps", "concurrent_parts"):
            if getattr(self, name) < 0:
                self._fail(name, "a non-negative integer")
        if not self.learning_rate > 0:
            self._fail("learning_rate", "> 0")
        if not 0.0 <= self.min_lr_ratio <= 1.0:
            self._fail("min_lr_ratio", "in [0, 1]")
        if not self.clip >= 0:
            self._fail("clip", ">= 0 (0 switches clipping off)")
        if self.max_eval_batch == 0 or self.max_eval_batch < -1:
            self._fail("max_eval_batch", "-1 (the whole split) or a positive integer")
        for name in ("eval_tgt_len",):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                self._fail(name, "a positive integer")
        if self.eval_mem_len is not None and self.eval_mem_len < 0:
            self._fail("eval_mem_len", "a non-negative integer")
        pieces = self.batch_chunk * max(self.concurrent_parts, 1)
        if self.train_batch_size % pieces:
            raise ValueError(
                f"`batch_chunk` x `concurrent_parts` = {pieces} must divide the per-replica batch; "
                f"train_batch_size={self.train_batch_size}."
            )


# A run preset: a model preset and the training settings that go with it.
QUICKSTART = "quickstart"  # the run preset of a bare train_gpu.py
RUN_PRESETS = {
    # The README's first command: 3-4 minutes on 2 CPU cores; evaluation on 200 batches
    # (part of the validation split, and the log says so).
    "quickstart": {
        "model": "cpu_small",
        "dataset": "stdlib",
        "train": dict(model_dir="runs/quickstart", learning_rate=1e-3, warmup_steps=100, train_batch_size=16,
                      eval_batch_size=16, train_steps=1200, iterations=100, save_steps=400, max_eval_batch=200),
    },
}
