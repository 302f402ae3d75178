"""The training step of both trainers: what a step computes, decided once (in `keras.ops`;
the global norm by TensorFlow's own op on TensorFlow).

A step feeds its batch of streams through the model in pieces (`batch_chunk` chunks one
after another; on TensorFlow's CPU each chunk in `concurrent_parts` parts side by side). Each
piece's loss is its summed NLL over the step's global token count (`piece_loss`), so the
pieces' gradients add up to the gradient of the mean NLL of the global batch. Then, once
(`checked_gradients`): the gradients' global norm (unscaled by float16's loss scale), whether
the forward pass and the gradients are finite, and the gradients clipped to `clip`. The memory
advances only after a finite forward pass; Adam (`txl_keras.optimizers`) applies only finite
gradients, at `learning_rate_at(step)`; a non-finite step that is neither skipped
(`skip_nonfinite`) nor rescaled (float16) halts the run (`halts`), which resumes before it.

How the pieces' gradients are taken, summed over replicas and applied is each backend's: the
TensorFlow trainer (`trainer.Trainer`) per replica under `tf.distribute`, its gradients
all-reduced, Adam in TensorFlow's fused kernel; the JAX trainer (`jax_trainer.JaxTrainer`) on
the global batch under `keras.distribution`, one jitted program. `fit` runs Keras's own step
with the same loss (`models.transformer_xl_lm.mean_nll`) and optimizer (`optimizers.adam`).
"""

import keras
from keras import ops

from txl_keras.schedules import learning_rate


def piece_loss(nll, global_tokens):
    """`(loss, summed NLL)` of a piece: `nll` per token (any shape) summed in float32, and that
    sum over `global_tokens`, the step's target count over every replica."""
    nll_sum = ops.sum(ops.cast(nll, "float32"))
    return nll_sum / global_tokens, nll_sum


def added(total, grads):
    """The gradients summed piece by piece (`total` None before the first piece)."""
    return grads if total is None else [a + b for a, b in zip(total, grads)]


def global_norm(grads):
    """The gradients' global norm, float32: the square root of their summed squares.
    TensorFlow's own (`tf.linalg.global_norm`) reads each gradient once where `square` then
    `sum` read it twice (about 1 ms a step on a 5M-weight model, a 2-core CPU)."""
    grads = [ops.cast(g, "float32") for g in grads]
    if keras.config.backend() == "tensorflow":
        import tensorflow as tf

        return tf.linalg.global_norm(grads)
    return ops.sqrt(sum(ops.sum(ops.square(g)) for g in grads))


def checked_gradients(grads, nll_sum, clip, loss_scale=None):
    """A step's gradients, made ready for Adam.

    Args:
        grads: the step's gradients, summed over pieces and replicas (of the loss times
            `loss_scale`, where there is one).
        nll_sum: the step's summed NLL over every replica.
        clip: the global norm's bound (0: not clipped).
        loss_scale: float16's loss scale, or None.

    Returns:
        `(grads, gnorm, forward_ok, finite)`: the gradients unscaled and clipped (one
        multiplication each, none where neither applies), their global norm before clipping,
        whether the forward pass is finite (the memory may advance) and whether the gradients
        are too (Adam may apply them).
    """
    gnorm = global_norm(grads)
    factor = None
    if loss_scale is not None:
        gnorm = gnorm / loss_scale
        factor = 1.0 / loss_scale
    forward_ok = ops.isfinite(nll_sum)
    finite = ops.isfinite(gnorm) & forward_ok
    if clip > 0:
        bound = clip / ops.maximum(gnorm, clip)
        factor = bound if factor is None else factor * bound
    if factor is not None:
        grads = [g * ops.cast(factor, g.dtype) for g in grads]
    return grads, gnorm, forward_ok, finite


def halts(finite, train_config, rescales=False):
    """Whether a step halts the run: its gradients are not finite and the run neither skips
    such steps (`skip_nonfinite`) nor rescales the loss for them (float16, `rescales`)."""
    return ~finite & (not (rescales or train_config.skip_nonfinite))


def learning_rate_at(step, train_config):
    """The learning rate of step `step` (0-based), the run's schedule (`txl_keras.schedules`)."""
    tc = train_config
    return learning_rate(step, tc.learning_rate, tc.train_steps, tc.warmup_steps, tc.min_lr_ratio, tc.lr_schedule)
