"""Adam (`txl_keras.optimizers`' recipe) applied once to all-reduced, clipped gradients,
under any tf.distribute strategy.

Keras's optimizers all-reduce inside `apply_gradients` after clipping each replica's
gradient; the original GPU trainer clips the averaged gradient. This one takes
gradients that are already summed over replicas, so clipping sees the global norm, and
its state is plain variables that checkpoints save and restore exactly.
"""

import keras
import tensorflow as tf

from txl_keras.optimizers import BETA_1, BETA_2, EPSILON

class Adam:
    """Adam with the TF defaults (beta_1 0.9, beta_2 0.999, epsilon 1e-8, no decay).

    Create it under `strategy.scope()`. `apply(grads, lr)` runs in cross-replica
    context with per-replica gradients that are identical on every replica.
    """

    def __init__(self, variables, beta_1=BETA_1, beta_2=BETA_2, epsilon=EPSILON):
        self.strategy = tf.distribute.get_strategy()
        self.variables = [v.value if isinstance(v, keras.Variable) else v for v in variables]
        self.beta_1, self.beta_2, self.epsilon = beta_1, beta_2, epsilon
        self.iterations = tf.Variable(0, dtype=tf.int64, trainable=False, name="adam_iterations")
        self.m = [tf.Variable(tf.zeros(v.shape, v.dtype), trainable=False, name="adam_m") for v in self.variables]
        self.v = [tf.Variable(tf.zeros(v.shape, v.dtype), trainable=False, name="adam_v") for v in self.variables]

    @property
    def state(self):
        """Every variable of the optimizer, in a fixed order (for checkpoints)."""
        return [self.iterations] + self.m + self.v

    def apply(self, grads, lr):
        strategy = self.strategy
        self.iterations.assign_add(1)
        t = tf.cast(self.iterations, tf.float32)
        b1_power, b2_power = tf.pow(self.beta_1, t), tf.pow(self.beta_2, t)
        b1, b2, eps = self.beta_1, self.beta_2, self.epsilon

        def update(var, grad, m, v):
            # The fused kernel of TF's Adam: one op per variable instead of ten.
            dtype = var.dtype
            return tf.raw_ops.ResourceApplyAdam(
                var=var.handle, m=m.handle, v=v.handle, beta1_power=tf.cast(b1_power, dtype),
                beta2_power=tf.cast(b2_power, dtype), lr=tf.cast(lr, dtype), beta1=tf.cast(b1, dtype),
                beta2=tf.cast(b2, dtype), epsilon=tf.cast(eps, dtype), grad=tf.cast(grad, dtype))

        for var, grad, m, v in zip(self.variables, grads, self.m, self.v):
            strategy.extended.update(var, update, args=(grad, m, v), group=False)
