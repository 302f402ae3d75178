"""Every weight starts from its own draw of the configured distribution (the original code
initialises each variable independently), large tables included (drawn as one graph on
TensorFlow, in row blocks elsewhere) without extra copies of the table."""

import itertools
import os
import subprocess
import sys
import textwrap

import keras
import numpy as np
import pytest

from txl_keras import TransformerXLLM
from txl_keras.layers import weight_initializers
from txl_keras.layers.weight_initializers import copy_initializer, weight_initializer

CONFIG = dict(n_token=300, n_layer=3, d_model=16, n_head=2, d_head=8, d_inner=16, tgt_len=4, mem_len=4,
              cutoffs=[100, 200], div_val=2, tie_weight=False, init="normal", init_std=0.05, proj_init_std=0.03)


def random_weights(model):
    return {w.path: np.asarray(w).ravel() for w in model.weights
            if "seed_generator" not in w.path and np.asarray(w).std() > 0}


@pytest.mark.parametrize("init", ["normal", "uniform"])
def test_every_weight_is_its_own_draw_of_the_configured_distribution(init):
    model = TransformerXLLM({**CONFIG, "init": init, "untie_r": False})
    weights = random_weights(model)
    # 3 layers x (qkv, r, o, 2 feed-forward kernels) + r_w/r_r biases + tables and projections
    assert len(weights) >= 3 * 5 + 2 + 6
    for (a, x), (b, y) in itertools.combinations(weights.items(), 2):
        n = min(len(x), len(y))
        assert not np.allclose(x[:n], y[:n]), f"{a} and {b} start equal"
    values = np.concatenate([w for name, w in weights.items() if "proj" not in name])
    if init == "normal":
        assert abs(values.std() / 0.05 - 1) < 0.03 and abs(values.mean()) < 0.003
    else:  # uniform in [-init_range, init_range]
        assert np.abs(values).max() <= CONFIG.get("init_range", 0.1)
        assert abs(values.std() / (0.1 / np.sqrt(3)) - 1) < 0.03


def test_same_seed_same_weights():
    first = random_weights(TransformerXLLM(CONFIG))
    keras.utils.set_random_seed(1234)  # as the autouse fixture did before the first model
    second = random_weights(TransformerXLLM(CONFIG))
    assert len(first) == len(second)
    for x, y in zip(first.values(), second.values()):
        np.testing.assert_array_equal(x, y)


@pytest.mark.parametrize("base", [keras.initializers.RandomNormal(1.0, 2.0), keras.initializers.RandomUniform(-3, 3),
                                  keras.initializers.TruncatedNormal(0.0, 1.0)])
def test_large_tables_are_independent_draws_of_the_distribution(monkeypatch, base):
    monkeypatch.setattr(weight_initializers, "BLOCK_VALUES", 600)  # large: 10 rows of 64 per block
    table = np.asarray(weight_initializer(base)((205, 64), dtype="float32"))
    assert table.shape == (205, 64)
    blocks = [table[i:i + 10].ravel() for i in range(0, 200, 10)]
    for x, y in itertools.combinations(blocks, 2):
        assert abs(np.corrcoef(x, y)[0, 1]) < 0.3
    expected = {keras.initializers.RandomNormal: (1.0, 2.0), keras.initializers.RandomUniform: (0.0, 6 / np.sqrt(12)),
                keras.initializers.TruncatedNormal: (0.0, 0.88)}[type(base)]
    assert abs(table.mean() - expected[0]) < 0.1 * expected[1] + 0.02
    assert abs(table.std() / expected[1] - 1) < 0.05
    if isinstance(base, keras.initializers.TruncatedNormal):
        outside = (np.abs(table) > 2.0).mean()
        # Keras's PyTorch sampler keeps the first of 4 normal draws inside [-2, 2], or the
        # last when none is (a chance of 4e-6 per value)
        assert outside <= (1e-3 if keras.config.backend() == "torch" else 0.0)


@pytest.mark.skipif(keras.config.backend() != "tensorflow", reason="TensorFlow's graph draw")
def test_a_large_table_costs_its_own_size_once_on_tensorflow():
    """The peak memory of drawing a 128 MB table (in a fresh process, after a first draw
    that starts TensorFlow's runtime) grows by about the table: an eager draw takes three
    times it, row blocks twice, and Grappler folding the graph's constants twice."""
    script = textwrap.dedent("""
        import resource
        import keras, numpy as np, tensorflow as tf
        from txl_keras.layers import weight_initializers
        from txl_keras.layers.weight_initializers import weight_initializer

        def peak_mb():
            return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

        weight_initializers.BLOCK_VALUES = 1000
        keras.Variable(weight_initializer(keras.initializers.RandomNormal(0.0, 0.02))((100, 100)))
        before = peak_mb()
        table = keras.Variable(weight_initializer(keras.initializers.RandomNormal(1.0, 0.02))((65536, 512)))
        grown = peak_mb() - before
        values = table.numpy()
        folding = tf.config.optimizer.get_experimental_options().get("constant_folding")
        print(grown, values.mean(), values.std(), folding)
    """)
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", KERAS_BACKEND="tensorflow")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    grown, mean, std, folding = out.stdout.split()[-4:]
    assert float(grown) < 1.4 * 128, f"drawing a 128 MB table raised the peak by {float(grown):.0f} MB"
    assert abs(float(mean) - 1.0) < 1e-3 and abs(float(std) / 0.02 - 1) < 0.01
    assert folding == "True"  # Grappler's option restored


def test_seeds_given_by_the_user_are_kept():
    seeded = keras.initializers.RandomNormal(0.0, 1.0, seed=7)
    np.testing.assert_array_equal(np.asarray(weight_initializer(seeded)((300, 4))),
                                  np.asarray(weight_initializer(seeded)((300, 4))))
    generator = keras.initializers.RandomNormal(seed=keras.random.SeedGenerator(3))
    assert copy_initializer(generator) is generator  # it advances by itself
    unseeded = keras.initializers.RandomNormal()
    assert not np.allclose(np.asarray(copy_initializer(unseeded)((3, 3))), np.asarray(copy_initializer(unseeded)((3, 3))))

    class Scaled(keras.initializers.Initializer):  # no get_config: cannot be rebuilt
        def __init__(self, scale):
            self.scale = scale

        def __call__(self, shape, dtype=None):
            return keras.ops.full(shape, self.scale, dtype=dtype)

    custom = Scaled(2.0)
    assert copy_initializer(custom) is custom
    np.testing.assert_array_equal(np.asarray(weight_initializer(custom)((3, 2))), 2.0)
