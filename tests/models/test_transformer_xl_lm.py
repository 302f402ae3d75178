import contextlib
import os

import keras
import numpy as np
import pytest
from conftest import attention_weights, feed_forward_weights, randomize, to_np

import reference
from txl_keras import TransformerXLConfig, TransformerXLLM, kernels
from txl_keras.layers import CacheStore
from txl_keras.layers.inference_cache import time_major

ADAPTIVE = dict(n_token=40, n_layer=2, d_model=12, d_embed=16, n_head=2, d_head=5, d_inner=20,
                dropout=0.0, dropatt=0.0, tgt_len=5, mem_len=6, cutoffs=[10, 24], div_val=2,
                untie_r=True, proj_share_all_but_first=True)


def build(cfg, **kwargs):
    model = TransformerXLLM(cfg, **kwargs)
    model.build((None, cfg.tgt_len))
    randomize(model, scale=0.2)
    return model


def numpy_weights(model):
    bb, soft = model.backbone, model.softmax
    w = {
        "tables": [to_np(t) for t in bb.word_emb.tables],
        "projs": [None if p is None else to_np(p) for p in bb.word_emb.projections],
        "r_w_bias": to_np(bb.r_w_bias),
        "r_r_bias": to_np(bb.r_r_bias),
        "layers": [{"attn": attention_weights(b.attention), "ff": feed_forward_weights(b.feed_forward)}
                   for b in bb.blocks],
        "clusters": [],
    }
    for i in range(soft.n_clusters):
        table, bias, proj = soft.cluster_weights(i)
        table = to_np(table)
        if soft.div_val == 1:  # one table for the whole vocabulary: the cluster's rows
            table = table[soft.bounds[i]:soft.bounds[i + 1]]
        w["clusters"].append((to_np(table), to_np(bias), None if proj is None else to_np(proj)))
    if soft.cutoffs:
        w["cluster_W"], w["cluster_b"] = to_np(soft.cluster_W), to_np(soft.cluster_b)
    return w


def tokens(cfg, batch, length, seed=0):
    return np.random.default_rng(seed).integers(0, cfg.n_token, (batch, length)).astype("int32")


@pytest.mark.parametrize("overrides", [
    {},
    {"same_length": True, "clamp_len": 3},
    {"same_length": True, "same_length_convention": "pytorch", "cluster_order": "pytorch"},
    {"pre_lnorm": True, "untie_r": False, "div_val": 1, "proj_share_all_but_first": False},
])
@pytest.mark.parametrize("path", ["fast", "reference", "cached"])
def test_two_segments_match_numpy_model(overrides, path):
    """The plain call with the fast kernels, with the paper's plain computation, and the
    frozen-weight call with the memory held as keys and values (`call_with_cache`)."""
    cfg = TransformerXLConfig(**{**ADAPTIVE, **overrides})
    model = build(cfg)
    w = numpy_weights(model)
    x1, x2 = tokens(cfg, 2, 5, 1), tokens(cfg, 2, 4, 2)
    h1, mems1, _ = reference.model_forward(w, cfg, x1)
    h2, mems2, log_probs2 = reference.model_forward(w, cfg, x2, mems1)
    with kernels.reference_kernels() if path == "reference" else contextlib.nullcontext():
        if path == "cached":
            cache = model.init_cache(2)
            _, cache = model.call_with_cache(x1, cache, targets=x2[:, :1].repeat(5, 1))
            out2, cache = model.call_with_cache(x2, cache, targets=x1[:, :4], return_log_probs=True)
            # the cache holds the keys and values of the memory the reference keeps
            memory_rows = model.backbone.memory_rows([m.astype("float32") for m in mems2])
            for layer, want in enumerate(memory_rows):
                np.testing.assert_allclose(to_np(time_major(cache.rows(layer, 6))), to_np(want), atol=2e-4)
        else:
            out1 = model(x1, targets=x2[:, :1].repeat(5, 1))
            out2 = model(x2, targets=x1[:, :4], mems=out1["mems"], return_log_probs=True)
            for got, want in zip(out2["mems"], mems2):
                np.testing.assert_allclose(to_np(got), want, atol=2e-4)
            assert to_np(out2["mems"][0]).shape == (2, 6, 12)
    np.testing.assert_allclose(to_np(out2["hidden"]), h2, atol=2e-4)
    np.testing.assert_allclose(to_np(out2["log_probs"]), log_probs2, atol=2e-4)
    want_nll = -np.take_along_axis(log_probs2, x1[:, :4, None], -1)[..., 0]
    np.testing.assert_allclose(to_np(out2["nll"]), want_nll, atol=2e-4)


@pytest.mark.parametrize("attn_type", [0, 1])
def test_segment_with_memory_equals_one_long_pass(attn_type):
    cfg = TransformerXLConfig(**{**ADAPTIVE, "attn_type": attn_type, "mem_len": 5, "tgt_len": 5})
    model = build(cfg)
    x = tokens(cfg, 3, 9)
    full = to_np(model(x)["hidden"])
    first = model(x[:, :5])
    second = to_np(model(x[:, 5:], mems=first["mems"])["hidden"])
    np.testing.assert_allclose(second, full[:, 5:], atol=1e-4)
    np.testing.assert_allclose(to_np(first["hidden"]), full[:, :5], atol=1e-4)


@pytest.mark.parametrize("overrides", [
    {"attn_type": 1},
    {"pre_lnorm": True, "mem_init": "zeros"},
    {"same_length": True, "clamp_len": 4, "ext_len": 2},
    {"attn_type": 2},  # absolute positions: the cache holds hidden states
    {"attn_type": 3, "d_head": 6, "mem_init": "zeros"},
])
def test_the_cached_call_equals_the_plain_call_segment_by_segment(overrides):
    """`call_with_cache` (the cache advanced functionally) and a `CacheStore` written in
    place, with the position keys projected once for more keys than needed, give the plain
    call's NLL over four segments; the store's rows are the plain memory's."""
    cfg = TransformerXLConfig(**{**ADAPTIVE, **overrides})
    model = build(cfg)
    x = tokens(cfg, 2, 20)
    plain = None
    cache = model.init_cache(2)
    store = CacheStore(cfg.mem_len, cfg.n_layer, *model.backbone.cache_layout, 2, 5 - cfg.ext_len)
    if cfg.mem_init == "zeros":
        zeros = [np.zeros((2, cfg.mem_len, cfg.d_model), "float32")] * cfg.n_layer
        store.reset(model.backbone.memory_rows(zeros), cfg.mem_len)
    keys = model.backbone.project_positions(cfg.mem_len + 7) if cfg.attn_type == 0 else ()
    for start in range(0, 20, 5):
        segment = x[:, start:start + 5]
        plain = model(segment, targets=segment, mems=plain and plain["mems"])
        cached, cache = model.call_with_cache(segment, cache, targets=segment)
        np.testing.assert_allclose(to_np(cached["nll"]), to_np(plain["nll"]), atol=1e-5)
        hidden, rows, valid = model.backbone.forward_with_cache(segment, store.read(keys))
        np.testing.assert_allclose(to_np(model.softmax(hidden, segment)), to_np(plain["nll"]), atol=1e-5)
        store.append(rows, valid)
        assert int(valid) == int(cache.valid) == int(plain["memory_valid"])
        n = int(valid)
        held = model.backbone.memory_rows(plain["mems"])
        for layer, want in enumerate(held):  # the cache holds exactly the memory it stands for
            np.testing.assert_allclose(to_np(time_major(store.read().rows(layer, cfg.mem_len)))[:, -n:],
                                       to_np(want)[:, -n:], atol=1e-5)


def test_a_cache_of_another_model_is_refused():
    model = build(TransformerXLConfig(**ADAPTIVE))
    cache = model.init_cache(2)
    with pytest.raises(ValueError, match="n_layer=2 rings"):
        model.call_with_cache(tokens(model.config, 2, 5), cache._replace(rings=cache.rings[:1]))
    with pytest.raises(ValueError, match=r"cache rings of shape \(4, batch_size, capacity >= mem_len=9, 5\)"):
        model.call_with_cache(tokens(model.config, 2, 5), cache, mem_len=9)


def test_k_segments_with_long_memory_equal_full_causal_pass():
    cfg = TransformerXLConfig(**{**ADAPTIVE, "mem_len": 12})
    model = build(cfg)
    x = tokens(cfg, 2, 12)
    full = to_np(model(x)["hidden"])
    mems, pieces = None, []
    for start in range(0, 12, 3):
        out = model(x[:, start:start + 3], mems=mems)
        mems = out["mems"]
        pieces.append(to_np(out["hidden"]))
    np.testing.assert_allclose(np.concatenate(pieces, 1), full, atol=1e-4)


@pytest.mark.parametrize("attn_type", [0, 1, 2, 3])
def test_outputs_are_causal(attn_type):
    cfg = TransformerXLConfig(**{**ADAPTIVE, "attn_type": attn_type, "n_head": 2, "d_head": 6})
    model = build(cfg)
    x = tokens(cfg, 2, 5)
    mems = model(tokens(cfg, 2, 5, 9))["mems"]
    y = x.copy()
    y[:, 3:] = (y[:, 3:] + 1) % cfg.n_token
    a = to_np(model(x, mems=mems)["hidden"])
    b = to_np(model(y, mems=mems)["hidden"])
    np.testing.assert_allclose(a[:, :3], b[:, :3], atol=1e-5)
    assert np.abs(a[:, 3:] - b[:, 3:]).max() > 1e-4


def test_stateful_model_equals_functional_model():
    cfg = TransformerXLConfig(**ADAPTIVE)
    functional = build(cfg)
    stateful = TransformerXLLM(cfg, stateful=True, batch_size=2)
    stateful.build((2, 5))
    stateful.set_weights(functional.get_weights())
    x = tokens(cfg, 2, 15)
    for _ in range(2):  # the second round starts after reset_memory()
        mems = None
        for start in range(0, 15, 5):
            seg = x[:, start:start + 5]
            want = functional(seg, targets=seg, mems=mems)
            mems = want["mems"]
            got = stateful(seg, targets=seg)
            np.testing.assert_allclose(to_np(got["nll"]), to_np(want["nll"]), atol=1e-5)
        stateful.reset_memory()


def test_zero_memory_init_attends_zeros():
    cfg = TransformerXLConfig(**{**ADAPTIVE, "mem_init": "zeros"})
    model = build(cfg)
    x = tokens(cfg, 2, 5)
    implicit = to_np(model(x)["hidden"])
    zeros = [np.zeros((2, 6, 12), "float32")] * 2
    explicit = to_np(model(x, mems=zeros)["hidden"])
    np.testing.assert_allclose(implicit, explicit, atol=1e-6)
    empty = build(TransformerXLConfig(**ADAPTIVE))
    empty.set_weights(model.get_weights())
    assert np.abs(to_np(empty(x)["hidden"]) - implicit).max() > 1e-4


def test_no_gradient_reaches_the_memory():
    if keras.config.backend() != "tensorflow":
        pytest.skip("uses tf.GradientTape")
    import tensorflow as tf

    cfg = TransformerXLConfig(**ADAPTIVE)
    model = build(cfg)
    x1, x2 = tokens(cfg, 2, 5, 1), tokens(cfg, 2, 5, 2)
    outside = model(x1)["mems"]
    with tf.GradientTape(persistent=True) as tape:
        inside = model(x1)["mems"]  # segment 1 computed under the tape this time
        through_mems = sum(tf.reduce_sum(m) for m in inside)
        loss_a = tf.reduce_mean(model(x2, targets=x2, mems=inside)["nll"])
        loss_b = tf.reduce_mean(model(x2, targets=x2, mems=outside)["nll"])
    assert all(g is None for g in tape.gradient(through_mems, model.trainable_variables))
    grads_a = tape.gradient(loss_a, model.trainable_variables)
    grads_b = tape.gradient(loss_b, model.trainable_variables)
    assert sum(g is not None for g in grads_a) > 10
    for a, b in zip(grads_a, grads_b):
        np.testing.assert_array_equal(tf.convert_to_tensor(a).numpy(), tf.convert_to_tensor(b).numpy())


def test_keras_file_and_weights_round_trip(tmp_path):
    cfg = TransformerXLConfig(**ADAPTIVE)
    model = build(cfg)
    x = tokens(cfg, 2, 5)
    want = to_np(model(x, targets=x)["nll"])
    path = os.path.join(tmp_path, "model.keras")
    model.save(path)
    loaded = keras.models.load_model(path)
    assert isinstance(loaded, TransformerXLLM) and loaded.config == cfg
    np.testing.assert_array_equal(to_np(loaded(x, targets=x)["nll"]), want)
    weights = os.path.join(tmp_path, "model.weights.h5")
    model.save_weights(weights)
    fresh = TransformerXLLM(cfg)
    fresh.build((None, 5))
    fresh.load_weights(weights)
    np.testing.assert_array_equal(to_np(fresh(x, targets=x)["nll"]), want)


@pytest.mark.parametrize("policy", ["mixed_bfloat16", "mixed_float16"])
def test_mixed_precision_runs_with_float32_softmax(policy):
    cfg = TransformerXLConfig(**ADAPTIVE)
    reference_model = build(cfg)
    x = tokens(cfg, 2, 5)
    want = to_np(reference_model(x, targets=x)["nll"])
    model = TransformerXLLM(cfg, dtype=policy)
    model.build((None, 5))
    model.set_weights(reference_model.get_weights())
    out = model(x, targets=x)
    out = model(x, targets=x, mems=out["mems"])
    assert keras.backend.standardize_dtype(out["nll"].dtype) == "float32"
    assert keras.backend.standardize_dtype(out["hidden"].dtype) == policy.split("_")[1]
    assert np.isfinite(to_np(out["nll"])).all()
    first = to_np(model(x, targets=x)["nll"])
    np.testing.assert_allclose(first, want, rtol=0.1, atol=0.1)


def test_bad_inputs_get_clear_errors():
    cfg = TransformerXLConfig(**ADAPTIVE)
    model = build(cfg)
    x = tokens(cfg, 2, 5)
    with pytest.raises(ValueError, match=r"Token ids must be in \[0, n_token=40\)"):
        model(x + 40)
    with pytest.raises(ValueError, match=r"Token ids must be in"):
        model(x, targets=x - 1)
    mems = model(x)["mems"]
    with pytest.raises(ValueError, match="n_layer=2 tensors"):
        model(x, mems=mems[:1])
    with pytest.raises(ValueError, match=r"mems\[0\] of shape"):
        model(x, mems=[np.zeros((2, 3, 7), "float32")] * 2)
    with pytest.raises(ValueError, match=r"mems\[1\] of shape"):
        model(x, mems=[mems[0], np.zeros((3, 6, 12), "float32")])
    with pytest.raises(ValueError, match="tokens` of shape"):
        model(x[0])
    stateful = TransformerXLLM(cfg, stateful=True, batch_size=2)
    with pytest.raises(ValueError, match="stateful"):
        stateful(x, mems=mems)
    with pytest.raises(ValueError, match="keeps the memory of batch_size=2 streams; received tokens of 3 streams"):
        stateful(tokens(cfg, 3, 5))
    for valid in (-7, 6):  # mems of 5 slots (the first segment's)
        with pytest.raises(ValueError, match=r"Expected `memory_valid` to be an integer in \[0, 5\]"):
            model(x, mems=mems, memory_valid=valid)
    cache = model.init_cache(2)
    with pytest.raises(ValueError, match=r"Expected `cache.valid` to be an integer in \[0, 6\]"):
        model.call_with_cache(x, cache._replace(valid=np.int32(-5)))
    # nested Python lists are token ids too
    np.testing.assert_allclose(to_np(model(x.tolist(), targets=x.tolist())["nll"]), to_np(model(x, targets=x)["nll"]))


def test_fit_learns_from_context_only_the_memory_holds():
    """Stateful `model.fit` on four streams of random 8-token blocks, each followed by a
    copy of itself, in segments of 8: a copied token is 8 positions back, always in the
    previous segment, so only the memory can predict it. With memory the loss falls toward
    (1/2 + 1/16) log 16; the same model without memory stays at log 16."""
    rng = np.random.default_rng(0)
    blocks = rng.integers(0, 16, (4, 40, 8))
    data = np.concatenate([blocks, blocks], axis=2).reshape(4, -1)
    n = (data.shape[1] - 1) // 8
    inputs = np.concatenate([data[:, i * 8:(i + 1) * 8] for i in range(n)]).astype("int32")
    targets = np.concatenate([data[:, i * 8 + 1:(i + 1) * 8 + 1] for i in range(n)]).astype("int32")
    final = {}
    for mem_len in (8, 0):
        keras.utils.set_random_seed(0)
        cfg = TransformerXLConfig.from_preset("tiny", n_token=16, mem_len=mem_len)
        model = TransformerXLLM(cfg, stateful=True, batch_size=4)
        model.compile(optimizer=keras.optimizers.Adam(1e-2))
        history = model.fit(inputs, targets, batch_size=4, epochs=8, shuffle=False, verbose=0)
        final[mem_len] = history.history["loss"][-1]
        if mem_len:
            _, valid = model.backbone.memory.read()
            assert int(to_np(valid)) == mem_len
    assert final[0] > 0.95 * np.log(16)  # nothing to learn without the memory
    assert final[8] < final[0] - 0.6


def test_vanilla_transformer_attn_type_2_matches_numpy():
    """attn_type 2 with mem_len 0: absolute sinusoids added to the embeddings, plain causal
    attention, as the original's vanilla Transformer."""
    cfg = TransformerXLConfig(**{**ADAPTIVE, "attn_type": 2, "mem_len": 0, "cutoffs": [], "div_val": 1,
                                 "d_embed": 12, "n_head": 2, "d_head": 6})
    model = build(cfg)
    x = tokens(cfg, 2, 5)
    got = to_np(model(x)["hidden"])
    table = to_np(model.backbone.word_emb.tables[0])
    h = table[x] * np.sqrt(cfg.d_model) + reference.sinusoid(np.arange(4, -1, -1), cfg.d_model)
    for block in model.backbone.blocks:
        h = reference.relative_attention(h, None, attention_weights(block.attention), cfg.n_head,
                                         cfg.d_head, eps=cfg.layer_norm_epsilon)
        h = reference.feed_forward(h, feed_forward_weights(block.feed_forward), eps=cfg.layer_norm_epsilon)
    np.testing.assert_allclose(got, h, atol=2e-4)


def test_a_memory_valid_per_row_equals_each_row_with_its_own_count():
    """Rows of one batch at different places in their streams: each row's NLL and new
    count are those of the row run alone with its own count (fast and reference kernels)."""
    from txl_keras.kernels import reference_kernels

    model = TransformerXLLM(TransformerXLConfig.from_preset("tiny", n_token=20, cutoffs=[], same_length=False))
    rng = np.random.default_rng(0)
    x = rng.integers(0, 20, (3, 5)).astype("int32")
    mems = [rng.normal(size=(3, 8, 16)).astype("float32") for _ in range(2)]
    valid = np.array([0, 3, 8], "int32")
    for context in (reference_kernels, contextlib.nullcontext):
        with context():
            out = model(x, targets=x, mems=mems, memory_valid=valid)
        for r in range(3):
            one = model(x[r:r + 1], targets=x[r:r + 1], mems=[m[r:r + 1] for m in mems], memory_valid=int(valid[r]))
            np.testing.assert_allclose(to_np(out["nll"])[r], to_np(one["nll"])[0], atol=1e-5)
            assert int(to_np(out["memory_valid"])[r]) == int(to_np(one["memory_valid"]))
    with pytest.raises(ValueError, match=r"Expected `memory_valid` to be an integer in \[0, 8\]"):
        model(x, mems=mems, memory_valid=np.array([0, 9, 1], "int32"))
