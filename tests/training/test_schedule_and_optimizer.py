import math

import numpy as np
import pytest
import tensorflow as tf

from txl_keras.training.optimizer import Adam, adam_update
from txl_keras.schedules import learning_rate


def test_cosine_with_warmup_matches_formula():
    base, total, warm, ratio = 1e-3, 100, 10, 0.01
    for step in [0, 5, 10, 40, 100, 150]:
        got = float(learning_rate(step, base, total, warm, ratio, "cosine"))
        if step < warm:
            want = base * step / warm
        else:
            progress = min((step - warm) / (total - warm), 1.0)
            want = base * ((1 - ratio) * 0.5 * (1 + math.cos(math.pi * progress)) + ratio)
        assert got == pytest.approx(want, rel=1e-5, abs=1e-12)


def test_inv_sqrt_and_constant():
    assert float(learning_rate(400, 1.0, 1000, 100, schedule="inv_sqrt")) == pytest.approx(0.5)
    assert float(learning_rate(50, 1.0, 1000, 100, schedule="inv_sqrt")) == pytest.approx(0.5)
    assert float(learning_rate(700, 2.0, 1000, 0, schedule="constant")) == pytest.approx(2.0)
    with pytest.raises(ValueError, match="lr_schedule"):
        learning_rate(1, 1.0, 10, schedule="linear")


def test_adam_matches_numpy_reference():
    rng = np.random.default_rng(0)
    init = rng.normal(size=(3, 2)).astype("float32")
    var = tf.Variable(init)
    adam = Adam([var])
    m = np.zeros_like(init, np.float64)
    v = np.zeros_like(init, np.float64)
    x = init.astype(np.float64)
    for t in range(1, 6):
        g = rng.normal(size=(3, 2)).astype("float32")
        adam.apply([tf.constant(g)], tf.constant(0.01))
        m = 0.9 * m + 0.1 * g
        v = 0.999 * v + 0.001 * g * g
        alpha = 0.01 * math.sqrt(1 - 0.999**t) / (1 - 0.9**t)
        x = x - alpha * m / (np.sqrt(v) + 1e-8)
        np.testing.assert_allclose(var.numpy(), x, rtol=1e-5, atol=1e-6)
    assert int(adam.iterations.numpy()) == 5


def test_the_keras_ops_adam_step_is_the_fused_kernels():
    # The JAX trainer's Adam (keras.ops) beside TensorFlow's fused kernel, step by step.
    rng = np.random.default_rng(1)
    init = rng.normal(size=(4, 3)).astype("float32")
    var = tf.Variable(init)
    fused = Adam([var])
    x, m, v = init, np.zeros_like(init), np.zeros_like(init)
    for t in range(1, 5):
        g = rng.normal(size=(4, 3)).astype("float32")
        fused.apply([tf.constant(g)], tf.constant(0.003))
        x, m, v = (np.asarray(a) for a in adam_update(x, g, m, v, t, 0.003))
        np.testing.assert_allclose(x, var.numpy(), rtol=1e-6, atol=1e-7)
        np.testing.assert_allclose(m, fused.m[0].numpy(), rtol=1e-6, atol=1e-7)
        np.testing.assert_allclose(v, fused.v[0].numpy(), rtol=3e-5, atol=1e-9)
