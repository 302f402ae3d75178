import math

import numpy as np
import pytest
import tensorflow as tf

from txl_keras import optimizers
from txl_keras.optimizers import adam_update
from txl_keras.schedules import learning_rate
from txl_keras.training.optimizer import Adam


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


def test_fits_optimizer_is_the_trainers_recipe_clipping_included():
    """`optimizers.adam()` (what `compile()` gives `fit`) against a numpy re-derivation of
    the trainers' step: the global norm clipped to 0.25, then Adam with epsilon 1e-8."""
    rng = np.random.default_rng(2)
    inits = [rng.normal(size=(3, 2)).astype("float32"), rng.normal(size=(4,)).astype("float32")]
    variables = [tf.Variable(x) for x in inits]
    optimizer = optimizers.adam(0.01)
    xs = [x.astype(np.float64) for x in inits]
    ms = [np.zeros_like(x) for x in xs]
    vs = [np.zeros_like(x) for x in xs]
    for t in range(1, 6):
        grads = [rng.normal(size=x.shape).astype("float32") * 3.0 for x in inits]
        optimizer.apply_gradients(zip([tf.constant(g) for g in grads], variables))
        norm = math.sqrt(sum(float(np.sum(np.square(g.astype(np.float64)))) for g in grads))
        factor = min(1.0, 0.25 / norm)
        alpha = 0.01 * math.sqrt(1 - 0.999**t) / (1 - 0.9**t)
        for k, g in enumerate(grads):
            g = g * factor
            ms[k] = 0.9 * ms[k] + 0.1 * g
            vs[k] = 0.999 * vs[k] + 0.001 * g * g
            xs[k] = xs[k] - alpha * ms[k] / (np.sqrt(vs[k]) + 1e-8)
    for variable, x in zip(variables, xs):
        np.testing.assert_allclose(variable.numpy(), x, rtol=1e-5, atol=1e-6)
