"""Learning-rate schedules of the original trainers, as functions of the step."""

import math

import tensorflow as tf

SCHEDULES = ("cosine", "inv_sqrt", "constant")


def learning_rate(step, base_lr, train_steps, warmup_steps=0, min_lr_ratio=0.004, schedule="cosine"):
    """The learning rate at `step` (a scalar tensor or int).

    Linear warmup from 0 over `warmup_steps`, then `cosine`: the TF code's
    `cosine_decay(base_lr, step - warmup, train_steps - warmup, alpha=min_lr_ratio)`;
    `inv_sqrt`: `base_lr * sqrt(warmup / step)` (PyTorch code); `constant`.
    """
    if schedule not in SCHEDULES:
        raise ValueError(f"Expected `lr_schedule` in {SCHEDULES}. Received: {schedule!r}")
    step = tf.cast(step, tf.float32)
    warmup = float(warmup_steps)
    if schedule == "cosine":
        decay_steps = float(max(1, train_steps - warmup_steps))
        progress = tf.clip_by_value((step - warmup) / decay_steps, 0.0, 1.0)
        cosine = 0.5 * (1.0 + tf.cos(math.pi * progress))
        after = base_lr * ((1.0 - min_lr_ratio) * cosine + min_lr_ratio)
    elif schedule == "inv_sqrt":
        after = base_lr * tf.math.rsqrt(tf.maximum(step, 1.0) / max(warmup, 1.0))
    else:
        after = tf.constant(base_lr, tf.float32)
    if warmup_steps > 0:
        return tf.where(step < warmup, base_lr * step / warmup, after)
    return after
