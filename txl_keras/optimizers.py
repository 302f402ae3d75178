"""The optimizer of the paper's runs, one recipe for every way to train: Adam with
TensorFlow's defaults (beta_1 0.9, beta_2 0.999, epsilon 1e-8, no weight decay), the
gradient's global norm clipped to `CLIP_NORM`, the learning rate warmed up and decayed from a
peak of `LEARNING_RATE` (`txl_keras.schedules`), as in the original scripts.

It runs three ways, tested equal step by step: `adam` is Keras's optimizer with these
settings (`fit`); `adam_update` is one step in `keras.ops` (the JAX trainer's); the
TensorFlow trainer applies it with TensorFlow's fused kernel
(`txl_keras.training.optimizer.Adam`, after all-reducing the gradients).
"""

LEARNING_RATE = 2.5e-4  # the peak learning rate of the original scripts
CLIP_NORM = 0.25  # the gradient's global norm, at most
BETA_1, BETA_2, EPSILON = 0.9, 0.999, 1e-8


def adam(learning_rate=LEARNING_RATE, clip_norm=CLIP_NORM):
    """Keras's `Adam` with the recipe's moments and epsilon, the gradient's global norm
    clipped to `clip_norm` (0 or None: not clipped); `learning_rate` a float or a schedule
    (`txl_keras.schedules.WarmupCosine`)."""
    import keras  # (here: the trainers read the constants to define their flags, before Keras loads)

    return keras.optimizers.Adam(learning_rate, beta_1=BETA_1, beta_2=BETA_2, epsilon=EPSILON,
                                 global_clipnorm=clip_norm or None)


def adam_update(variable, grad, m, v, t, lr, beta_1=BETA_1, beta_2=BETA_2, epsilon=EPSILON):
    """One Adam step in `keras.ops`: `t` the step count after this step (>= 1), returns
    `(variable, m, v)` updated.

        m = m + (1 - beta_1) * (grad - m);  v = v + (1 - beta_2) * (grad**2 - v)
        variable = variable - lr * sqrt(1 - beta_2**t) / (1 - beta_1**t) * m / (sqrt(v) + epsilon)
    """
    from keras import ops

    dtype = variable.dtype
    grad = ops.cast(grad, dtype)
    t = ops.cast(t, "float32")
    step = ops.cast(lr * ops.sqrt(1.0 - ops.power(beta_2, t)) / (1.0 - ops.power(beta_1, t)), dtype)
    m = m + (grad - m) * (1.0 - beta_1)
    v = v + (ops.square(grad) - v) * (1.0 - beta_2)
    return variable - step * m / (ops.sqrt(v) + epsilon), m, v
