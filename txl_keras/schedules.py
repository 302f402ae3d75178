"""The learning rate of the original trainers, in `keras.ops`: one formula for the trainers
(`learning_rate`, a function of the step) and for Keras's `fit` (`WarmupCosine`, a Keras
schedule sized by `fit`)."""

import math

import keras
from keras import ops

SCHEDULES = ("cosine", "inv_sqrt", "constant")


def learning_rate(step, base_lr, train_steps, warmup_steps=0, min_lr_ratio=0.004, schedule="cosine"):
    """The learning rate at `step` (an int or a scalar tensor), a float32 scalar.

    Linear warmup from 0 over `warmup_steps`, then `cosine`: the TF code's
    `cosine_decay(base_lr, step - warmup, train_steps - warmup, alpha=min_lr_ratio)`;
    `inv_sqrt`: `base_lr * sqrt(warmup / step)` (PyTorch code); `constant`.
    """
    if schedule not in SCHEDULES:
        raise ValueError(f"Expected `lr_schedule` in {SCHEDULES}. Received: {schedule!r}")
    step = ops.cast(step, "float32")
    warmup = float(warmup_steps)
    if schedule == "cosine":
        progress = ops.clip((step - warmup) / float(max(1, train_steps - warmup_steps)), 0.0, 1.0)
        cosine = 0.5 * (1.0 + ops.cos(math.pi * progress))
        after = base_lr * ((1.0 - min_lr_ratio) * cosine + min_lr_ratio)
    elif schedule == "inv_sqrt":
        after = base_lr * ops.rsqrt(ops.maximum(step, 1.0) / max(warmup, 1.0))
    else:
        after = ops.full((), base_lr, "float32")
    if warmup_steps > 0:
        return ops.where(step < warmup, base_lr * step / warmup, after)
    return after


@keras.saving.register_keras_serializable(package="txl_keras")
class WarmupCosine(keras.optimizers.schedules.LearningRateSchedule):
    """`learning_rate(..., schedule="cosine")` as a Keras schedule: a linear warmup from 0
    to `peak` over `warmup_steps`, then the TF code's cosine decay to `peak * min_ratio` at
    `total_steps`, counted from the optimizer's step `start_step` (where a `fit` began).
    Before `size(total_steps)` it stays at `peak`.

    Args:
        peak: float > 0.
        total_steps: int or None (set later by `size`).
        warmup_steps: int or None (a tenth of `total_steps`, at most 1,000).
        min_ratio: float in [0, 1].
        start_step: int >= 0, the optimizer's step at which the schedule starts.
    """

    def __init__(self, peak, total_steps=None, warmup_steps=None, min_ratio=0.004, start_step=0):
        self.peak, self.min_ratio = float(peak), float(min_ratio)
        self.total_steps, self.warmup_steps, self.start_step = None, None, 0
        if total_steps is not None:
            self.size(total_steps, warmup_steps, start_step)

    @property
    def sized(self):
        return self.total_steps is not None

    def size(self, total_steps, warmup_steps=None, start_step=0):
        """Fix the schedule's length (and its warmup, by default a tenth of it, at most
        1,000), starting at the optimizer's step `start_step`."""
        if isinstance(total_steps, bool) or not isinstance(total_steps, int) or total_steps < 1:
            raise ValueError(f"Expected `total_steps` to be a positive integer. Received: total_steps={total_steps!r}")
        if isinstance(start_step, bool) or not isinstance(start_step, int) or start_step < 0:
            raise ValueError(f"Expected `start_step` to be a non-negative integer. Received: start_step={start_step!r}")
        self.total_steps, self.start_step = total_steps, start_step
        self.warmup_steps = min(1000, total_steps // 10) if warmup_steps is None else int(warmup_steps)

    def __call__(self, step):
        if not self.sized:
            return ops.full((), self.peak, "float32")
        return learning_rate(ops.cast(step, "float32") - float(self.start_step), self.peak, self.total_steps,
                             self.warmup_steps, self.min_ratio, "cosine")

    def get_config(self):
        return {"peak": self.peak, "total_steps": self.total_steps, "warmup_steps": self.warmup_steps,
                "min_ratio": self.min_ratio, "start_step": self.start_step}
