"""Original checkpoints built in their own layouts, converted, and compared with an
independent numpy forward pass (tests/reference.py) fed the original arrays."""

import os
import pickle

import keras
import numpy as np
import pytest
from conftest import to_np

import reference
from original_formats import CASES, DH, DI, D, H, L, tf_arrays, write_cache_pkl, write_tf_checkpoint
from txl_keras import TransformerXLConfig
from txl_keras.convert import ConversionError, from_pytorch_state_dict, from_tf_checkpoint, load_cache_vocab

pytestmark = pytest.mark.skipif(keras.config.backend() != "tensorflow", reason="TF checkpoints")

# Each source's numerics, written from the reference notes (not read from txl_keras.convert):
# TF code: attended zero memory, mem_len + 1 keys per query with same_length, head column
# cutoffs[0] + i - 1 for cluster i, LayerNorm epsilon 1e-12. Original PyTorch: no first
# memory, mem_len keys, column -i, 1e-5. Hugging Face: zero memory (init_mems), the PyTorch
# mask, the TF column order (cluster_prob_idx), 1e-5.
TF_CODE = {"mem_init": "zeros", "same_length_convention": "tf", "cluster_order": "tf", "layer_norm_epsilon": 1e-12}
PT_CODE = {"mem_init": "empty", "same_length_convention": "pytorch", "cluster_order": "pytorch",
           "layer_norm_epsilon": 1e-5}
HF_CODE = {"mem_init": "zeros", "same_length_convention": "pytorch", "cluster_order": "tf",
           "layer_norm_epsilon": 1e-5}

def reference_weights(a, softmax_projs, n_token, cutoffs, div_val):
    bounds = [0] + cutoffs + [n_token]
    t = lambda name: a["transformer/" + name]  # noqa: E731
    if div_val == 1:
        tables = [t("adaptive_embed/lookup_table")]
        projs = [a.get("transformer/adaptive_embed/proj_W")]
        out_tables = [tables[0][bounds[i]:bounds[i + 1]] for i in range(len(bounds) - 1)]
    else:
        tables = [t(f"adaptive_embed/cutoff_{i}/lookup_table") for i in range(len(bounds) - 1)]
        projs = [a.get(f"transformer/adaptive_embed/cutoff_{i}/proj_W") for i in range(len(bounds) - 1)]
        out_tables = tables
    layers = []
    for l in range(L):
        p = f"layer_{l}/"
        layers.append({
            "attn": {"qkv": t(p + "rel_attn/qkv/kernel"), "r": t(p + "rel_attn/r/kernel"),
                     "o": t(p + "rel_attn/o/kernel"), "gamma": t(p + "rel_attn/LayerNorm/gamma"),
                     "beta": t(p + "rel_attn/LayerNorm/beta")},
            "ff": {"k1": t(p + "ff/layer_1/kernel"), "b1": t(p + "ff/layer_1/bias"),
                   "k2": t(p + "ff/layer_2/kernel"), "b2": t(p + "ff/layer_2/bias"),
                   "gamma": t(p + "ff/LayerNorm/gamma"), "beta": t(p + "ff/LayerNorm/beta")},
        })
    if cutoffs:
        biases = [t(f"adaptive_softmax/cutoff_{i}/b") for i in range(len(bounds) - 1)]
    else:
        biases = [t("adaptive_softmax/bias")]
    w = {"tables": tables, "projs": projs, "layers": layers, "r_w_bias": t("r_w_bias"),
         "r_r_bias": t("r_r_bias"),
         "clusters": [(out_tables[i], biases[i], softmax_projs[i]) for i in range(len(biases))]}
    if cutoffs:
        w["cluster_W"], w["cluster_b"] = t("adaptive_softmax/cutoff_0/cluster_W"), t("adaptive_softmax/cutoff_0/cluster_b")
    return {k: v for k, v in w.items()}


@pytest.mark.parametrize("case", sorted(CASES))
def test_tf_checkpoint_reproduces_the_tf_forward_pass(tmp_path, case):
    n_token, cutoffs, div_val, d_embed, untie_r, share, same_dim = CASES[case]
    rng = np.random.default_rng(0)
    arrays, softmax_projs = tf_arrays(rng, n_token, cutoffs, div_val, d_embed, untie_r, share, same_dim)
    prefix = write_tf_checkpoint(str(tmp_path / "model.ckpt"), arrays)
    model = from_tf_checkpoint(prefix, tgt_len=3, mem_len=4, same_length=True, clamp_len=3)
    c = model.config
    assert (c.n_layer, c.n_token, c.cutoffs, c.div_val, c.untie_r) == (L, n_token, cutoffs, div_val, untie_r)
    assert {k: getattr(c, k) for k in TF_CODE} == TF_CODE
    reference_config = c.replace(**TF_CODE)  # the quirks from here, not from the converter
    w = reference_weights(arrays, softmax_projs, n_token, cutoffs, div_val)
    x = rng.integers(0, n_token, (2, 3)).astype("int32")
    y = rng.integers(0, n_token, (2, 3)).astype("int32")
    mems = [np.zeros((2, 4, D))] * L  # the TF code's zero memory, attended
    out = None
    for _ in range(2):  # two segments
        out = model(x, targets=y, mems=None if out is None else out["mems"], return_log_probs=True)
        _, mems, log_probs = reference.model_forward(w, reference_config, x, mems)
        np.testing.assert_allclose(to_np(out["log_probs"]), log_probs, atol=2e-4)


def test_wrong_config_and_missing_files_are_explained(tmp_path):
    arrays, _ = tf_arrays(np.random.default_rng(0), *CASES["wt103"])
    prefix = write_tf_checkpoint(str(tmp_path / "model.ckpt"), arrays)
    with pytest.raises(ConversionError, match="trained with another config|does not match the config"):
        from_tf_checkpoint(prefix, tgt_len=3, mem_len=4, d_inner=DI + 2)
    with pytest.raises(ConversionError, match="Cannot read a TF checkpoint"):
        from_tf_checkpoint(str(tmp_path / "nothing.ckpt"))
    partial = {k: v for k, v in arrays.items() if not k.endswith("layer_0/ff/layer_1/kernel")}
    with pytest.raises(ConversionError, match="not a complete Transformer-XL checkpoint: 'layer_0/ff/layer_1/kernel'"):
        from_tf_checkpoint(write_tf_checkpoint(str(tmp_path / "partial.ckpt"), partial))
    flat = {**arrays, "transformer/r_w_bias": arrays["transformer/r_w_bias"].reshape(-1)}
    with pytest.raises(ConversionError, match=r"r_w_bias has shape \(16,\)"):
        from_tf_checkpoint(write_tf_checkpoint(str(tmp_path / "flat.ckpt"), flat))
    config = TransformerXLConfig.from_preset("tiny")
    for state_dict in ({}, [1, 2], {"word_emb.emb_layers.0.weight": np.zeros((4, 2))}):
        with pytest.raises(ConversionError, match="state dict"):
            from_pytorch_state_dict(state_dict, config)


def test_a_cache_pkl_that_is_not_a_vocabulary_is_explained(tmp_path):
    import pickle

    with open(tmp_path / "list.pkl", "wb") as f:
        pickle.dump(["a", "b"], f, protocol=2)
    with pytest.raises(ConversionError, match="holds a list, not the original Corpus or Vocab"):
        load_cache_vocab(str(tmp_path / "list.pkl"))
    write_cache_pkl(str(tmp_path / "bad_unk.pkl"), ["<eos>", "a", "<unk>"], unk_idx=9)
    with pytest.raises(ConversionError, match="by id 9, outside its 3 symbols"):
        load_cache_vocab(str(tmp_path / "bad_unk.pkl"))


@pytest.mark.parametrize("naming", ["original", "huggingface"])
def test_pytorch_state_dict(tmp_path, naming):
    n_token, cutoffs = 30, [6, 14]
    rng = np.random.default_rng(1)
    arrays, softmax_projs = tf_arrays(rng, n_token, cutoffs, 2, D, False, True, True)
    t = lambda name: arrays["transformer/" + name]  # noqa: E731
    sd = {"r_w_bias": t("r_w_bias"), "r_r_bias": t("r_r_bias"), "pos_emb.inv_freq": np.zeros(D // 2)}
    for i in range(3):
        sd[f"word_emb.emb_layers.{i}.weight"] = t(f"adaptive_embed/cutoff_{i}/lookup_table")
        sd[f"word_emb.emb_projs.{i}"] = t(f"adaptive_embed/cutoff_{i}/proj_W").T
        sd[f"crit.out_layers.{i}.weight"] = sd[f"word_emb.emb_layers.{i}.weight"]
        sd[f"crit.out_layers.{i}.bias"] = t(f"adaptive_softmax/cutoff_{i}/b")
        sd[f"crit.out_projs.{i}"] = softmax_projs[i].T
    sd["crit.cluster_weight"] = t("adaptive_softmax/cutoff_0/cluster_W")
    sd["crit.cluster_bias"] = t("adaptive_softmax/cutoff_0/cluster_b")
    for l in range(L):
        p = f"layer_{l}/"
        sd[f"layers.{l}.dec_attn.qkv_net.weight"] = t(p + "rel_attn/qkv/kernel").T
        sd[f"layers.{l}.dec_attn.r_net.weight"] = t(p + "rel_attn/r/kernel").T
        sd[f"layers.{l}.dec_attn.o_net.weight"] = t(p + "rel_attn/o/kernel").T
        sd[f"layers.{l}.dec_attn.layer_norm.weight"] = t(p + "rel_attn/LayerNorm/gamma")
        sd[f"layers.{l}.dec_attn.layer_norm.bias"] = t(p + "rel_attn/LayerNorm/beta")
        sd[f"layers.{l}.pos_ff.CoreNet.0.weight"] = t(p + "ff/layer_1/kernel").T
        sd[f"layers.{l}.pos_ff.CoreNet.0.bias"] = t(p + "ff/layer_1/bias")
        sd[f"layers.{l}.pos_ff.CoreNet.3.weight"] = t(p + "ff/layer_2/kernel").T
        sd[f"layers.{l}.pos_ff.CoreNet.3.bias"] = t(p + "ff/layer_2/bias")
        sd[f"layers.{l}.pos_ff.layer_norm.weight"] = t(p + "ff/LayerNorm/gamma")
        sd[f"layers.{l}.pos_ff.layer_norm.bias"] = t(p + "ff/LayerNorm/beta")
    from txl_keras import TransformerXLConfig

    expected = PT_CODE
    if naming == "huggingface":  # backbone under transformer., one bias pair per layer (untie_r)
        expected = HF_CODE
        sd = {(k if k.startswith("crit.") else "transformer." + k): v for k, v in sd.items()}
        for bias in ("r_w_bias", "r_r_bias"):
            shared = sd.pop("transformer." + bias)
            for l in range(L):
                sd[f"transformer.layers.{l}.dec_attn.{bias}"] = shared
    # the structure only: the quirk fields keep their defaults, the converter must pick the source's
    config = TransformerXLConfig(n_token=n_token, n_layer=L, d_model=D, n_head=H, d_head=DH, d_inner=DI,
                                 cutoffs=cutoffs, div_val=2, proj_share_all_but_first=True, dropout=0.0,
                                 tgt_len=3, mem_len=4, same_length=True, untie_r=naming == "huggingface")
    model = from_pytorch_state_dict(sd, config)
    assert {k: getattr(model.config, k) for k in expected} == expected
    if naming == "huggingface":
        w_shared = {"r_w_bias": arrays["transformer/r_w_bias"], "r_r_bias": arrays["transformer/r_r_bias"]}
        arrays["transformer/r_w_bias"] = np.stack([w_shared["r_w_bias"]] * L)
        arrays["transformer/r_r_bias"] = np.stack([w_shared["r_r_bias"]] * L)
    w = reference_weights(arrays, softmax_projs, n_token, cutoffs, 2)
    reference_config = config.replace(**expected)
    mems = [np.zeros((2, 4, D))] * L if expected["mem_init"] == "zeros" else None
    out = None
    for _ in range(2):  # two segments: the memory and the same_length mask of each source
        x = rng.integers(0, n_token, (2, 3)).astype("int32")
        out = model(x, mems=None if out is None else out["mems"], return_log_probs=True)
        _, mems, want = reference.model_forward(w, reference_config, x, mems)
        np.testing.assert_allclose(to_np(out["log_probs"]), want, atol=2e-4)
    # an explicit choice wins; a misspelt one is an error
    assert from_pytorch_state_dict(sd, config, cluster_order="tf").config.cluster_order == "tf"
    with pytest.raises(ConversionError, match="Unknown quirk overrides"):
        from_pytorch_state_dict(sd, config, cluster_ordr="tf")
    sd["unexpected.weight"] = np.zeros(3)
    with pytest.raises(ConversionError, match="not converted"):
        from_pytorch_state_dict(sd, config)


def test_cache_pkl_vocabulary_is_read_as_data_only(tmp_path):
    write_cache_pkl(str(tmp_path / "cache.pkl"), ["<eos>", "the", "cat", "<unk>"], unk="<unk>", dataset="wt103")
    loaded, dataset = load_cache_vocab(str(tmp_path / "cache.pkl"))
    assert dataset == "wt103" and loaded.symbols == ["<eos>", "the", "cat", "<unk>"]
    np.testing.assert_array_equal(loaded.encode_lines(["the dog"]), [1, 3, 0])

    class Evil:
        def __reduce__(self):
            return (os.system, ("echo pwned > " + str(tmp_path / "pwned"),))

    with open(tmp_path / "evil.pkl", "wb") as f:
        pickle.dump(Evil(), f, protocol=2)
    with pytest.raises(ConversionError, match="refusing to load"):
        load_cache_vocab(str(tmp_path / "evil.pkl"))
    assert not os.path.exists(tmp_path / "pwned")
