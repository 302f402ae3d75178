"""Original checkpoints built in their own layouts, converted, and compared with an
independent numpy forward pass (tests/reference.py) fed the original arrays."""

import os
import pickle
import sys
import types

import keras
import numpy as np
import pytest
from conftest import to_np

import reference
from txl_keras.convert import (ConversionError, from_pytorch_state_dict, from_tf_checkpoint,
                               load_cache_vocab, PT_QUIRKS)

pytestmark = pytest.mark.skipif(keras.config.backend() != "tensorflow", reason="TF checkpoints")

L, D, H, DH, DI = 2, 8, 2, 4, 12


def tf_arrays(rng, n_token, cutoffs, div_val, d_embed, untie_r, share_tail_projs, proj_same_dim):
    """Variables of tf/model.py for this setting, named and shaped as in its checkpoints,
    with the softmax projection of each cluster as the TF code picks it."""
    g = lambda *shape: rng.normal(0, 0.3, shape).astype("float32")  # noqa: E731
    a = {}
    bias_shape = (L, H, DH) if untie_r else (H, DH)
    a["transformer/r_w_bias"], a["transformer/r_r_bias"] = g(*bias_shape), g(*bias_shape)
    bounds = [0] + cutoffs + [n_token]
    emb_projs = []
    if div_val == 1:
        a["transformer/adaptive_embed/lookup_table"] = g(n_token, d_embed)
        if d_embed != D:
            a["transformer/adaptive_embed/proj_W"] = g(d_embed, D)
        emb_projs = [a.get("transformer/adaptive_embed/proj_W")] * (len(bounds) - 1)
    else:
        for i in range(len(bounds) - 1):
            w = d_embed // div_val**i
            a[f"transformer/adaptive_embed/cutoff_{i}/lookup_table"] = g(bounds[i + 1] - bounds[i], w)
            if not (w == D and not proj_same_dim):
                a[f"transformer/adaptive_embed/cutoff_{i}/proj_W"] = g(w, D)
            emb_projs.append(a.get(f"transformer/adaptive_embed/cutoff_{i}/proj_W"))
    for l in range(L):
        p = f"transformer/layer_{l}/"
        a[p + "rel_attn/qkv/kernel"], a[p + "rel_attn/r/kernel"] = g(D, 3 * H * DH), g(D, H * DH)
        a[p + "rel_attn/o/kernel"] = g(H * DH, D)
        a[p + "rel_attn/LayerNorm/gamma"], a[p + "rel_attn/LayerNorm/beta"] = 1 + g(D), g(D)
        a[p + "ff/layer_1/kernel"], a[p + "ff/layer_1/bias"] = g(D, DI), g(DI)
        a[p + "ff/layer_2/kernel"], a[p + "ff/layer_2/bias"] = g(DI, D), g(D)
        a[p + "ff/LayerNorm/gamma"], a[p + "ff/LayerNorm/beta"] = 1 + g(D), g(D)
    softmax_projs = []
    if not cutoffs:
        a["transformer/adaptive_softmax/bias"] = g(n_token)
        softmax_projs = [emb_projs[0]]
    else:
        a["transformer/adaptive_softmax/cutoff_0/cluster_W"] = g(len(cutoffs), d_embed)
        a["transformer/adaptive_softmax/cutoff_0/cluster_b"] = g(len(cutoffs))
        for i in range(len(bounds) - 1):
            a[f"transformer/adaptive_softmax/cutoff_{i}/b"] = g(bounds[i + 1] - bounds[i])
            w = d_embed // div_val**i
            if i > 0 and share_tail_projs:
                softmax_projs.append(emb_projs[i])
            elif (div_val == 1 or not proj_same_dim) and w == D:
                softmax_projs.append(None)
            else:
                a[f"transformer/adaptive_softmax/cutoff_{i}/proj"] = g(w, D)
                softmax_projs.append(a[f"transformer/adaptive_softmax/cutoff_{i}/proj"])
    return a, softmax_projs


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


def write_tf_checkpoint(path, arrays):
    import tensorflow as tf

    graph = tf.Graph()
    with graph.as_default():
        for name, value in arrays.items():
            tf.compat.v1.Variable(value, name=name)
            tf.compat.v1.Variable(np.zeros_like(value), name=name + "/Adam")  # dropped
            tf.compat.v1.Variable(np.zeros_like(value), name=name + "/Adam_1")
        tf.compat.v1.Variable(np.int64(7), name="global_step")
        saver = tf.compat.v1.train.Saver()
        with tf.compat.v1.Session(graph=graph) as session:
            session.run(tf.compat.v1.global_variables_initializer())
            return saver.save(session, path)


CASES = {  # name: (n_token, cutoffs, div_val, d_embed, untie_r, proj_share_all_but_first, proj_same_dim)
    "wt103": (30, [6, 14], 2, D, True, True, True),
    "lm1b": (30, [6, 14], 2, D, True, False, False),
    "enwik8": (20, [], 1, D, False, False, True),
    "div_val_1_adaptive": (30, [6, 14], 1, 12, True, True, True),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_tf_checkpoint_reproduces_the_tf_forward_pass(tmp_path, case):
    n_token, cutoffs, div_val, d_embed, untie_r, share, same_dim = CASES[case]
    rng = np.random.default_rng(0)
    arrays, softmax_projs = tf_arrays(rng, n_token, cutoffs, div_val, d_embed, untie_r, share, same_dim)
    prefix = write_tf_checkpoint(str(tmp_path / "model.ckpt"), arrays)
    model = from_tf_checkpoint(prefix, tgt_len=3, mem_len=4, same_length=True, clamp_len=3)
    c = model.config
    assert (c.n_layer, c.n_token, c.cutoffs, c.div_val, c.untie_r) == (L, n_token, cutoffs, div_val, untie_r)
    assert (c.mem_init, c.same_length_convention, c.layer_norm_epsilon) == ("zeros", "tf", 1e-12)
    w = reference_weights(arrays, softmax_projs, n_token, cutoffs, div_val)
    x = rng.integers(0, n_token, (2, 3)).astype("int32")
    y = rng.integers(0, n_token, (2, 3)).astype("int32")
    mems = [np.zeros((2, 4, D))] * L  # the TF code's zero memory, attended
    out = None
    for _ in range(2):  # two segments
        out = model(x, targets=y, mems=None if out is None else out["mems"], return_log_probs=True)
        _, mems, log_probs = reference.model_forward(w, c, x, mems)
        np.testing.assert_allclose(to_np(out["log_probs"]), log_probs, atol=2e-4)


def test_wrong_config_and_missing_files_are_explained(tmp_path):
    arrays, _ = tf_arrays(np.random.default_rng(0), *CASES["wt103"])
    prefix = write_tf_checkpoint(str(tmp_path / "model.ckpt"), arrays)
    with pytest.raises(ConversionError, match="trained with another config|does not match the config"):
        from_tf_checkpoint(prefix, tgt_len=3, mem_len=4, d_inner=DI + 2)
    with pytest.raises(ConversionError, match="Cannot read a TF checkpoint"):
        from_tf_checkpoint(str(tmp_path / "nothing.ckpt"))


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
    from txl_keras.convert import HF_QUIRKS

    quirks = PT_QUIRKS
    if naming == "huggingface":  # backbone under transformer., one bias pair per layer (untie_r)
        quirks = {**HF_QUIRKS, "mem_init": "empty"}
        sd = {(k if k.startswith("crit.") else "transformer." + k): v for k, v in sd.items()}
        for bias in ("r_w_bias", "r_r_bias"):
            shared = sd.pop("transformer." + bias)
            for l in range(L):
                sd[f"transformer.layers.{l}.dec_attn.{bias}"] = shared
    config = TransformerXLConfig(n_token=n_token, n_layer=L, d_model=D, n_head=H, d_head=DH, d_inner=DI,
                                 cutoffs=cutoffs, div_val=2, proj_share_all_but_first=True, dropout=0.0,
                                 tgt_len=3, mem_len=4, untie_r=naming == "huggingface", **quirks)
    model = from_pytorch_state_dict(sd, config)
    if naming == "huggingface":
        w_shared = {"r_w_bias": arrays["transformer/r_w_bias"], "r_r_bias": arrays["transformer/r_r_bias"]}
        arrays["transformer/r_w_bias"] = np.stack([w_shared["r_w_bias"]] * L)
        arrays["transformer/r_r_bias"] = np.stack([w_shared["r_r_bias"]] * L)
    w = reference_weights(arrays, softmax_projs, n_token, cutoffs, 2)
    x = rng.integers(0, n_token, (2, 3)).astype("int32")
    got = to_np(model(x, return_log_probs=True)["log_probs"])
    _, _, want = reference.model_forward(w, config, x)  # empty first memory, PyTorch cluster order
    np.testing.assert_allclose(got, want, atol=2e-4)
    sd["unexpected.weight"] = np.zeros(3)
    with pytest.raises(ConversionError, match="not converted"):
        from_pytorch_state_dict(sd, config)


def test_cache_pkl_vocabulary_is_read_as_data_only(tmp_path):
    vocabulary = types.ModuleType("vocabulary")
    data_utils = types.ModuleType("data_utils")

    class Vocab:
        pass

    class Corpus:
        pass

    Vocab.__module__, Corpus.__module__ = "vocabulary", "data_utils"
    Vocab.__qualname__, Corpus.__qualname__ = "Vocab", "Corpus"
    vocabulary.Vocab, data_utils.Corpus = Vocab, Corpus
    sys.modules["vocabulary"], sys.modules["data_utils"] = vocabulary, data_utils
    try:
        vocab = Vocab()
        vocab.__dict__.update(idx2sym=["<eos>", "the", "cat", "<unk>"], unk_idx=3, lower_case=False,
                              special=["<eos>"], counter=__import__("collections").Counter(["the"]))
        corpus = Corpus()
        corpus.__dict__.update(vocab=vocab, dataset="wt103", train=np.arange(5))
        with open(tmp_path / "cache.pkl", "wb") as f:
            pickle.dump(corpus, f, protocol=2)
    finally:
        del sys.modules["vocabulary"], sys.modules["data_utils"]
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
