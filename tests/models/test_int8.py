"""int8 weights: the quantized model computes exactly the float model whose weights are the
int8 values divided by their scales (numpy), on every path (NLL whole and streamed,
log-probabilities, scoring, generation); the rounding stays within half a step; a quantized
preset and SavedModel give the same tokens; bad requests get one clear error each."""

import json

import keras
import numpy as np
import pytest
from conftest import SMALL_ADAPTIVE, randomize, to_np

from tf_records.vocabulary import Vocabulary
from txl_keras import (TransformerXLCausalLM, TransformerXLCausalLMPreprocessor, TransformerXLConfig,
                       TransformerXLLM, TransformerXLTokenizer)
from txl_keras.generate import generate, score
from txl_keras.layers import RelativeAttention, quantization

TIED = dict(n_token=300, n_layer=2, d_model=16, d_embed=16, n_head=2, d_head=8, d_inner=24, dropout=0.0, tgt_len=6,
            mem_len=6, cutoffs=[100, 200], div_val=1, same_length=True, clamp_len=5)
CONFIGS = {"tied, div_val 1": TIED, "untied, div_val 2": {**SMALL_ADAPTIVE, "tie_weight": False}}


def float_and_int8(config):
    """A randomized float model, and a copy of it quantized."""
    model = TransformerXLLM(TransformerXLConfig(**config))
    randomize(model, scale=0.5)
    quantized = TransformerXLLM.from_config(model.get_config())
    quantized.set_weights(model.get_weights())
    quantized.quantize("int8")
    return model, quantized


def dequantized(model, quantized):
    """`model` given the quantized model's weights as float: each int8 row divided by its
    scale (a table's rows; a kernel's, transposed back to `(in, out)`), in numpy."""
    weights = {w.path: to_np(w) for w in quantized.weights}
    for w in model.weights:
        if w.path + "_scale" in weights:
            q, scale = weights[w.path].astype(np.float64), weights[w.path + "_scale"].astype(np.float64)
            rows = q / scale[:, None]
            is_table = w.path.endswith("lookup_table") or w.path.endswith("_weight")
            w.assign((rows if is_table else rows.T).astype("float32"))
    return model


def test_rounding_is_within_half_a_step_per_row_and_column():
    rng = np.random.default_rng(0)
    values = rng.normal(0, 1, (50, 30)) * rng.uniform(0.01, 10, (50, 1))
    for axis in (0, 1):
        q, scale = quantization.quantize_values(values, axis)
        assert q.dtype == np.int8 and q.min() >= -127 and q.max() <= 127
        step = np.max(np.abs(values), axis=axis, keepdims=True) / 127
        restored = q / np.expand_dims(scale, axis)
        assert np.all(np.abs(restored - values) <= step / 2 + 1e-6)
        assert np.all(np.max(np.abs(q), axis=axis) == 127)  # each row's (column's) largest value uses the range


@pytest.mark.parametrize("name", list(CONFIGS))
def test_the_quantized_model_is_the_float_model_with_the_dequantized_weights(name):
    model, quantized = float_and_int8(CONFIGS[name])
    n_token = model.config.n_token
    assert quantized.quantization == "int8" and quantized.get_config()["quantization"] == "int8"
    assert {str(w.dtype) for w in quantized.weights} == {"float32", "int8"}
    floats = model.get_weights()
    reference = dequantized(model, quantized)
    tokens = np.random.default_rng(1).integers(0, n_token, (2, 6)).astype("int32")
    for training in (False, None):  # the NLL streamed over the tables, and by whole clusters
        np.testing.assert_allclose(to_np(quantized(tokens, targets=tokens, training=training)["nll"]),
                                   to_np(reference(tokens, targets=tokens, training=training)["nll"]),
                                   rtol=1e-5, atol=1e-5)
    log_probs = to_np(quantized(tokens, return_log_probs=True)["log_probs"])
    np.testing.assert_allclose(log_probs, to_np(reference(tokens, return_log_probs=True)["log_probs"]), atol=1e-5)
    np.testing.assert_allclose(np.exp(log_probs.astype(np.float64)).sum(-1), 1.0, atol=1e-5)
    long = np.random.default_rng(2).integers(0, n_token, (2, 20)).astype("int32")
    np.testing.assert_allclose(to_np(score(quantized, long)), to_np(score(reference, long)), rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(np.asarray(generate(quantized, long[:1, :7], 8, temperature=0)),
                                  np.asarray(generate(reference, long[:1, :7], 8, temperature=0)))
    # and the float model's own weights (random, std 0.5: sharper than trained ones) give
    # log-probabilities within 0.05 nats on average
    reference.set_weights(floats)
    drift = np.abs(log_probs - to_np(reference(tokens, return_log_probs=True)["log_probs"]))
    assert drift.mean() < 0.05, drift.mean()


def test_int8_weights_take_under_a_third_of_float32s_bytes():
    config = dict(TIED, n_token=5000, cutoffs=[1000, 3000], d_model=64, d_embed=64, d_inner=128, n_head=4, d_head=16)
    model, quantized = float_and_int8(config)
    size = lambda m: sum(int(np.prod(w.shape)) * np.dtype(w.dtype).itemsize for w in m.weights)  # noqa: E731
    assert size(quantized) <= size(model) / 3, (size(quantized), size(model))


def test_a_quantized_preset_loads_back_quantized(tmp_path):
    model, quantized = float_and_int8(TIED)
    vocab = Vocabulary([f"w{i}" for i in range(TIED["n_token"])], level="word")
    lm = TransformerXLCausalLM(quantized, TransformerXLCausalLMPreprocessor(TransformerXLTokenizer(vocab), 6))
    lm.save_to_preset(str(tmp_path / "preset"))
    assert json.load(open(tmp_path / "preset" / "config.json"))["config"]["quantization"] == "int8"
    loaded = TransformerXLCausalLM.from_preset(str(tmp_path / "preset"))
    assert loaded.model.quantization == "int8"
    tokens = np.random.default_rng(3).integers(0, TIED["n_token"], (2, 6)).astype("int32")
    np.testing.assert_array_equal(to_np(loaded.model(tokens, targets=tokens)["nll"]),
                                  to_np(quantized(tokens, targets=tokens)["nll"]))
    text = " ".join(f"w{i}" for i in tokens[0])
    assert loaded.generate(text, max_new_tokens=5, sampler="greedy") == lm.generate(text, max_new_tokens=5,
                                                                                     sampler="greedy")


@pytest.mark.skipif(keras.config.backend() != "tensorflow", reason="SavedModels are TensorFlow's")
def test_a_quantized_model_exports_and_its_saved_model_generates_the_same_text(tmp_path):
    import tensorflow as tf

    from txl_keras.export import export_saved_model

    _, quantized = float_and_int8(TIED)
    vocab = Vocabulary([f"w{i}" for i in range(TIED["n_token"])], level="word")
    export_saved_model(quantized, str(tmp_path / "saved"), vocab)
    served = tf.saved_model.load(str(tmp_path / "saved"))
    lm = TransformerXLCausalLM(quantized, TransformerXLCausalLMPreprocessor(TransformerXLTokenizer(vocab), 6))
    prompt = "w5 w17 w250 w3 w99 w100 w201"
    out = served.generate(prompts=tf.constant([prompt]), max_new_tokens=tf.constant(6), temperature=tf.constant(0.0),
                          top_k=tf.constant(0), seed=tf.constant(0))
    text = next(v for v in out.values() if v.dtype == tf.string).numpy()[0].decode()
    assert text == lm.generate(prompt, max_new_tokens=6, sampler="greedy")


def test_a_quantized_layer_rebuilds_quantized_from_its_config():
    rng = np.random.default_rng(4)
    h, memory, encoding = (rng.normal(size=s).astype("float32") for s in ((2, 5, 8), (2, 6, 8), (11, 8)))
    layer = RelativeAttention(2, 4)
    layer(h, memory=memory, position_encoding=encoding)
    layer.quantize("int8")
    assert layer.quantization_mode == "int8" and str(layer.qkv_kernel.dtype) == "int8"
    again = RelativeAttention.from_config(layer.get_config())
    again(h, memory=memory, position_encoding=encoding)
    assert str(again.o_kernel.dtype) == "int8"
    again.set_weights(layer.get_weights())
    np.testing.assert_array_equal(to_np(again(h, memory=memory, position_encoding=encoding)),
                                  to_np(layer(h, memory=memory, position_encoding=encoding)))


@pytest.mark.parametrize("call, message", [
    (lambda m: m.quantize("int4"), "quantizes to 'int8'.*mode='int4'"),
    (lambda m: m.quantize("int3"), "Invalid quantization mode"),
    (lambda m: m.quantize("int8", filters="rel_attn"), "converts the whole model; drop filters="),
    (lambda m: (m.quantize("int8"), m.quantize("int8")), "already quantized \\(int8\\)"),
    (lambda m: (m.quantize("int8"), m.enable_lora(2)), "LoRA adapts float kernels"),
    (lambda m: (m.enable_lora(2), m.quantize("int8")), "merge_lora_weights\\(\\) first"),
    (lambda m: m.softmax.quantize("int8"), "quantize the embedding first"),
])
def test_bad_requests_get_one_clear_error(call, message):
    model = TransformerXLLM(TransformerXLConfig(**TIED))
    with pytest.raises(ValueError, match=message):
        call(model)


def test_the_task_quantizes_its_model_and_its_compiled_steps_follow():
    model, quantized = float_and_int8(TIED)
    vocab = Vocabulary([f"w{i}" for i in range(TIED["n_token"])], level="word")
    task = lambda m: TransformerXLCausalLM(m, TransformerXLCausalLMPreprocessor(TransformerXLTokenizer(vocab), 6))  # noqa: E731
    floats = model.get_weights()
    lm = task(model)
    text = "w5 w17 w250 w3 w99 w100 w201 w7 w8"
    before = lm.score(text).log_likelihoods  # the scoring steps compiled with the float weights
    lm.quantize("int8")
    assert lm.model.quantization == "int8"
    after = lm.score(text).log_likelihoods
    reference = TransformerXLLM(TransformerXLConfig(**TIED))
    reference.set_weights(floats)
    expected = task(dequantized(reference, quantized)).score(text).log_likelihoods
    np.testing.assert_allclose(after, expected, rtol=1e-5, atol=1e-5)
    assert np.abs(after - before).max() > 1e-4  # the int8 weights are what scored
