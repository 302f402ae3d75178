"""The switch: a whole model trains and evaluates to the same numbers with the fast kernels
and with the paper's plain computation."""

import keras
import numpy as np
import pytest
from conftest import randomize, to_np

from txl_keras import TransformerXLConfig, TransformerXLLM, kernels

ADAPTIVE = dict(n_token=40, n_layer=2, d_model=12, d_embed=16, n_head=2, d_head=5, d_inner=20, dropout=0.0,
                tgt_len=5, mem_len=6, cutoffs=[10, 24], div_val=2, untie_r=True, proj_share_all_but_first=True,
                same_length=True, clamp_len=4)


def test_the_switch_is_scoped_and_read_at_call_time():
    assert kernels.fast_kernels_enabled()
    with kernels.reference_kernels():
        assert not kernels.fast_kernels_enabled()
        kernels.enable_fast_kernels()
        assert kernels.fast_kernels_enabled()
    assert kernels.fast_kernels_enabled()
    kernels.disable_fast_kernels()
    try:
        assert not kernels.fast_kernels_enabled()
    finally:
        kernels.enable_fast_kernels()


@pytest.mark.skipif(keras.config.backend() != "tensorflow", reason="tf.GradientTape over the model's variables")
@pytest.mark.parametrize("overrides", [{}, {"pre_lnorm": True, "mem_init": "zeros", "cutoffs": [], "div_val": 1}])
def test_training_gradients_equal_the_plain_computations(overrides):
    import tensorflow as tf

    model = TransformerXLLM(TransformerXLConfig(**{**ADAPTIVE, **overrides}))
    randomize(model, scale=0.3)
    x = np.random.default_rng(0).integers(0, 40, (3, 10)).astype("int32")
    mems = model(x[:, :5])["mems"]

    def grads():
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(model(x[:, 5:], targets=x[:, 4:9], mems=mems, training=True)["nll"])
        return float(loss), [tf.convert_to_tensor(g).numpy() for g in tape.gradient(loss, model.trainable_variables)]

    fast_loss, fast = grads()
    with kernels.reference_kernels():
        plain_loss, plain = grads()
    assert fast_loss == pytest.approx(plain_loss, rel=1e-6)
    assert sum(np.abs(g).sum() > 0 for g in plain) > 10
    for a, b in zip(fast, plain):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)


def test_evaluation_with_the_cache_equals_the_plain_computations():
    model = TransformerXLLM(TransformerXLConfig(**ADAPTIVE))
    randomize(model, scale=0.3)
    x = np.random.default_rng(1).integers(0, 40, (2, 21)).astype("int32")

    def nll():
        cache, out = model.init_cache(2), []
        for start in range(0, 20, 5):
            result, cache = model.call_with_cache(x[:, start:start + 5], cache, targets=x[:, start + 1:start + 6])
            out.append(to_np(result["nll"]))
        return np.concatenate(out, axis=1)

    fast = nll()
    with kernels.reference_kernels():
        np.testing.assert_allclose(fast, nll(), rtol=1e-5, atol=1e-5)
