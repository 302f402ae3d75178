"""LoRA: adapters on the attention's query, key, value and output projections, checked
against the plain layer given the kernels `W + (alpha / rank) A @ B` (numpy), frozen weights
that stay bit-identical through `fit`, merging, adapter files and presets that keep them."""

import json

import keras
import numpy as np
import pytest
from conftest import randomize, to_np

from tf_records.vocabulary import Vocabulary
from txl_keras import (TransformerXLCausalLM, TransformerXLCausalLMPreprocessor, TransformerXLConfig,
                       TransformerXLLM, TransformerXLTokenizer)
from txl_keras.layers import RelativeAttention

TEXT = "".join(f"line {i} of the play, said one; {i * 7} to {i % 5}.\n" for i in range(40))


def tiny_lm(**kwargs):
    config = TransformerXLConfig.from_preset("tiny", n_token=64, cutoffs=[], tgt_len=8, mem_len=8, dropout=0.0)
    model = TransformerXLLM(config, **kwargs)
    randomize(model, scale=0.5)
    return model


def nll(model, tokens):
    return to_np(model(tokens, targets=tokens)["nll"])


def random_adapters(model, seed=0):
    rng = np.random.default_rng(seed)
    for weight in model.trainable_weights:
        weight.assign(rng.normal(0, 0.2, weight.shape).astype("float32"))


def test_an_adapted_layer_is_the_plain_layer_with_the_summed_kernels():
    rng = np.random.default_rng(1)
    h, memory, encoding = (rng.normal(size=s).astype("float32") for s in ((2, 5, 8), (2, 6, 8), (11, 8)))
    adapted = RelativeAttention(2, 4, name="adapted")
    adapted(h, memory=memory, position_encoding=encoding)
    adapted.enable_lora(3, lora_alpha=6)
    for weight in adapted.lora_weights():
        weight.assign(rng.normal(0, 0.3, weight.shape).astype("float32"))
    plain = RelativeAttention(2, 4, name="plain")
    plain(h, memory=memory, position_encoding=encoding)
    qkv_a, qkv_b, o_a, o_b = (to_np(w) for w in adapted.lora_weights())
    plain.set_weights([to_np(adapted.qkv_kernel) + 2.0 * qkv_a @ qkv_b, to_np(adapted.r_kernel),
                       to_np(adapted.o_kernel) + 2.0 * o_a @ o_b] + [to_np(w) for w in adapted.layer_norm.weights])
    np.testing.assert_allclose(to_np(adapted(h, memory=memory, position_encoding=encoding)),
                               to_np(plain(h, memory=memory, position_encoding=encoding)), rtol=1e-5, atol=1e-5)
    again = RelativeAttention.from_config(adapted.get_config())
    again(h, memory=memory, position_encoding=encoding)
    assert [w.path.split("/")[-1] for w in again.trainable_weights] == ["qkv_lora_a", "qkv_lora_b", "o_lora_a",
                                                                        "o_lora_b"]


def test_only_the_adapters_train_and_fresh_adapters_change_nothing():
    model = tiny_lm()
    tokens = np.arange(16, dtype="int32").reshape(2, 8) % 64
    before = nll(model, tokens)
    model.enable_lora(4)
    c = model.config
    inner = c.n_head * c.d_head
    assert len(model.trainable_weights) == 4 * c.n_layer
    assert sum(int(np.prod(w.shape)) for w in model.trainable_weights) == \
        c.n_layer * 4 * (c.d_model + 3 * inner + inner + c.d_model)
    np.testing.assert_array_equal(nll(model, tokens), before)  # B is zero
    assert model.get_config()["lora_rank"] == 4


def test_fit_trains_the_adapters_alone_and_merging_keeps_the_outputs():
    vocab = Vocabulary(sorted(set(TEXT)), level="char")
    config = TransformerXLConfig.from_preset("tiny", n_token=len(vocab), cutoffs=[], tgt_len=8, mem_len=8)
    model = TransformerXLLM(config)
    randomize(model, scale=0.5)
    lm = TransformerXLCausalLM(model, TransformerXLCausalLMPreprocessor(TransformerXLTokenizer(vocab), 8))
    model.enable_lora(4)
    frozen = {w.path: to_np(w).copy() for w in model.weights if not w.trainable}
    lm.compile(optimizer=keras.optimizers.Adam(1e-2))
    first = np.ravel(lm.evaluate(TEXT, batch_size=2, verbose=0))[0]
    lm.fit(TEXT, batch_size=2, epochs=3, verbose=0)
    assert np.ravel(lm.evaluate(TEXT, batch_size=2, verbose=0))[0] < first - 0.05
    for weight in model.weights:
        if weight.path in frozen:
            np.testing.assert_array_equal(to_np(weight), frozen[weight.path], err_msg=weight.path)
    tokens = np.asarray(lm.tokenizer(TEXT[:16]))[None]
    adapted = nll(model, tokens)
    model.merge_lora_weights()
    np.testing.assert_allclose(nll(model, tokens), adapted, atol=1e-5)
    assert model.lora_rank is None and "lora_rank" not in model.get_config()
    assert len(model.trainable_weights) == len(TransformerXLLM(config).trainable_weights)


def test_adapter_files_and_presets_carry_the_adapters(tmp_path):
    model = tiny_lm()
    model.enable_lora(2, lora_alpha=4)
    random_adapters(model)
    tokens = np.arange(16, dtype="int32").reshape(2, 8) % 64
    adapted = nll(model, tokens)
    model.save_lora_weights(tmp_path / "a.lora.h5")
    fresh = tiny_lm()  # the same base weights (randomize is seeded)
    fresh.load_lora_weights(str(tmp_path / "a.lora.h5"))
    assert (fresh.lora_rank, fresh.lora_alpha) == (2, 4.0)
    np.testing.assert_array_equal(nll(fresh, tokens), adapted)
    with pytest.raises(ValueError, match="rank 2 .* but this model's are of rank 3"):
        tiny_lm(lora_rank=3).load_lora_weights(str(tmp_path / "a.lora.h5"))

    vocab = Vocabulary([chr(97 + i) for i in range(64)], level="char")
    lm = TransformerXLCausalLM(model, TransformerXLCausalLMPreprocessor(TransformerXLTokenizer(vocab), 8))
    lm.save_to_preset(str(tmp_path / "preset"))
    assert json.load(open(tmp_path / "preset" / "config.json"))["config"]["lora_rank"] == 2
    loaded = TransformerXLCausalLM.from_preset(str(tmp_path / "preset"))
    assert (loaded.model.lora_rank, len(loaded.model.trainable_weights)) == (2, 4 * model.config.n_layer)
    np.testing.assert_array_equal(nll(loaded.model, tokens), adapted)


@pytest.mark.parametrize("call, message", [
    (lambda m: m.enable_lora(0), "expected `rank` to be an integer in \\[1, 16\\]"),
    (lambda m: m.enable_lora(17), "expected `rank` to be an integer in \\[1, 16\\]"),
    (lambda m: m.enable_lora(2.5), "expected `rank` to be an integer"),
    (lambda m: m.enable_lora(2, lora_alpha=-1), "expected `lora_alpha` to be a positive number"),
    (lambda m: (m.enable_lora(2), m.enable_lora(2)), "LoRA is already enabled \\(rank 2\\)"),
    (lambda m: m.merge_lora_weights(), "no LoRA adapters to merge"),
    (lambda m: m.save_lora_weights("adapters.h5"), "must end in `.lora.h5`"),
    (lambda m: m.load_lora_weights("/nonexistent/a.lora.h5"), "No LoRA weights at"),
])
def test_bad_lora_calls_are_one_clear_error(call, message):
    model = tiny_lm()
    with pytest.raises((ValueError, FileNotFoundError), match=message):
        call(model)
    assert model.lora_rank is None or message.startswith("LoRA is already")
    assert not [layer for layer in model._flatten_layers() if layer.quantization_mode]


def test_adapters_of_another_model_or_a_damaged_file_are_refused(tmp_path):
    other = TransformerXLLM(TransformerXLConfig.from_preset("tiny", n_token=64, cutoffs=[], n_layer=1))
    other.enable_lora(2)
    other.save_lora_weights(tmp_path / "other.lora.h5")
    model = tiny_lm()
    with pytest.raises(ValueError, match="holds the adapters of another model"):
        model.load_lora_weights(tmp_path / "other.lora.h5")
    (tmp_path / "bad.lora.h5").write_bytes(b"not hdf5")
    with pytest.raises(ValueError, match="is not a file of LoRA weights"):
        model.load_lora_weights(tmp_path / "bad.lora.h5")
    assert model.lora_rank is None and len(model.trainable_weights) == 26
