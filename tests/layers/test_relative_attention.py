import keras
import numpy as np
import pytest
from conftest import attention_weights, central_differences, gradient, randomize, to_np
from keras import ops

import reference
from txl_keras.layers import relative_attention
from txl_keras.layers.key_value_memory import head_major
from txl_keras.layers import (
    PositionalEmbedding,
    RelativeAttention,
    causal_attention_mask,
    relative_positions,
    relative_shift,
)

B, T, H, DH, D = 2, 4, 2, 3, 8


def test_relative_shift_maps_columns_to_distances():
    rng = np.random.default_rng(0)
    for t, m in [(3, 0), (3, 5), (4, 4), (1, 6)]:
        k = t + m
        x = rng.normal(size=(2, t, k + 1))
        shifted = to_np(relative_shift(ops.array(x)))
        assert shifted.shape == (2, t, k)
        for i in range(t):
            for j in range(m + i + 1):  # the unmasked region
                column = k - (m + i - j)  # column c encodes distance K-c
                assert shifted[0, i, j] == pytest.approx(x[0, i, column])
                assert shifted[1, i, j] == pytest.approx(x[1, i, column])


def test_positional_embedding_matches_sinusoid_formula():
    layer = PositionalEmbedding(hidden_dim=6, clamp_len=3)
    got = to_np(layer(relative_positions(5)))
    want = reference.sinusoid([3, 3, 2, 1, 0], 6)
    np.testing.assert_allclose(got, want, atol=1e-6)
    unclamped = to_np(layer(relative_positions(5), clamp_len=-1))
    np.testing.assert_allclose(unclamped, reference.sinusoid([4, 3, 2, 1, 0], 6), atol=1e-6)


@pytest.mark.parametrize("t,m,window,valid", [(3, 0, None, None), (3, 4, None, None),
                                               (3, 4, 4, None), (3, 4, 3, 2), (4, 2, None, 1)])
def test_mask_matches_definition(t, m, window, valid):
    got = to_np(causal_attention_mask(t, m, None if valid is None else ops.array(valid), window))
    for i in range(t):
        for j in range(m + t):
            assert bool(got[i, j]) == reference.allowed(i, j, m, window, valid)


def run_attention(mem_len, clamp_len=-1, window=None, valid=None, pre_lnorm=False, clamped_call=False,
                  position_keys=False, context=None, queries=False):
    """The layer against the brute force; `clamped_call` passes it `clamp_len` (it then
    scores the distinct distances only), `position_keys` the projected keys of only the
    distances it needs (`clamp_len + 1` rows); `context` "time" or "head" passes the keys
    and values of `[memory, h]` (`project_kv`) as `context_kv`, as they are or head-major;
    `queries` then projects `h`'s rows by `project_qkv` and passes its queries too."""
    rng = np.random.default_rng(1)
    layer = RelativeAttention(H, DH, pre_lnorm=pre_lnorm, layer_norm_epsilon=1e-5)
    h = rng.normal(size=(B, T, D)).astype("float32")
    mem = rng.normal(size=(B, mem_len, D)).astype("float32") if mem_len else None
    u, v = rng.normal(size=(2, H, DH)).astype("float32")
    k = T + mem_len
    pos = PositionalEmbedding(D, clamp_len=clamp_len)(relative_positions(k))
    mask = causal_attention_mask(T, mem_len, None if valid is None else ops.array(valid), window)
    layer(h, memory=mem, position_encoding=pos, content_bias=u, position_bias=v, attention_mask=mask)
    randomize(layer)
    positions = dict(position_encoding=pos)
    if position_keys:
        positions = dict(position_keys=layer.project_positions(pos[k - clamp_len - 1:]))
    if clamped_call:
        positions["clamp_len"] = clamp_len
    if context:
        if queries:  # the segment's rows in one product; the memory's by project_kv
            positions["queries"], kv = layer.project_qkv(h)
            kv = kv if mem is None else ops.concatenate([layer.project_kv(mem), kv], axis=1)
        else:
            kv = layer.project_kv(h if mem is None else np.concatenate([mem, h], axis=1))
        positions["context_kv"] = kv if context == "time" else tuple(ops.split(head_major(kv, H), 2, axis=0))
    got = to_np(layer(h, memory=None if context else mem, content_bias=u, position_bias=v, attention_mask=mask,
                      **positions))
    want = reference.relative_attention(
        h.astype(np.float64), None if mem is None else mem.astype(np.float64),
        attention_weights(layer), H, DH, u=u, v=v, clamp_len=clamp_len, window=window,
        valid=valid, pre_lnorm=pre_lnorm)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_attention_without_memory_matches_brute_force():
    run_attention(mem_len=0)


def test_attention_with_memory_matches_brute_force():
    run_attention(mem_len=5)


def test_attention_same_length_matches_brute_force():
    run_attention(mem_len=5, window=5)  # TF convention: mem_len + 1 keys
    run_attention(mem_len=5, window=4)  # PyTorch convention: mem_len keys


def test_attention_clamp_len_matches_brute_force():
    run_attention(mem_len=5, clamp_len=2)


@pytest.mark.parametrize("context", ["time", "head"])
@pytest.mark.parametrize("pre_lnorm", [False, True])
def test_attention_of_given_keys_and_values_matches_brute_force(context, pre_lnorm):
    run_attention(mem_len=5, window=5, valid=4, pre_lnorm=pre_lnorm, context=context)


@pytest.mark.parametrize("mem_len,pre_lnorm", [(5, False), (5, True), (0, False)])
def test_attention_of_given_queries_keys_and_values_matches_brute_force(mem_len, pre_lnorm):
    """`project_qkv`'s queries, keys and values of the segment (one product) with the
    memory's from `project_kv`: the cached-key path of evaluation and generation."""
    run_attention(mem_len=mem_len, window=5, pre_lnorm=pre_lnorm, context="head", queries=True)


def test_attention_uses_the_given_queries():
    """Zero queries and no biases score every key 0: each position averages the values
    of the keys it may see (brute force in numpy), whatever `h` would have projected."""
    rng = np.random.default_rng(3)
    layer = RelativeAttention(H, DH)
    h = rng.normal(size=(B, T, D)).astype("float32")
    mask = causal_attention_mask(T, 0)
    layer(h, attention_mask=mask)
    randomize(layer)
    kv = layer.project_kv(h)
    got = to_np(layer(h, queries=np.zeros((B, T, H * DH), "float32"), context_kv=kv, attention_mask=mask))
    w = attention_weights(layer)
    values = to_np(kv)[..., H * DH:]
    averaged = np.cumsum(values, axis=1) / np.arange(1, T + 1)[None, :, None]
    x = h + averaged @ w["o"]
    mean, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
    want = (x - mean) / np.sqrt(var + 1e-5) * w["gamma"] + w["beta"]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_attention_rejects_queries_of_another_width():
    layer = RelativeAttention(H, DH)
    h = np.zeros((B, T, D), "float32")
    layer(h)
    layer(h, queries=layer.project_qkv(h)[0])
    with pytest.raises(ValueError, match=r"queries` of shape \(batch_size, T, num_heads \* head_dim = 6\)"):
        layer(h, queries=np.zeros((B, T, D), "float32"))


@pytest.mark.parametrize("mem_len,clamp_len,window,valid,position_keys", [
    (5, 2, None, None, False),  # K 9: only the last clamp_len + T = 6 keys are shifted
    (6, 1, 5, 4, True),         # same_length, empty slots, keys of the 2 distinct distances
    (2, 2, None, None, True),   # clamp_len + T = K: every key shifted, 3 distinct of 6
    (1, 3, None, None, False),  # clamp_len + 1 > K: nothing to save, the plain path
])
def test_attention_scores_only_the_distinct_clamped_distances(mem_len, clamp_len, window, valid, position_keys):
    run_attention(mem_len=mem_len, clamp_len=clamp_len, window=window, valid=valid, clamped_call=True,
                  position_keys=position_keys)


def test_attention_rejects_position_keys_too_short():
    layer = RelativeAttention(H, DH)
    h = np.zeros((B, T, D), "float32")
    keys = np.zeros((H, DH, 3), "float32")
    with pytest.raises(ValueError, match="at least 4 columns"):
        layer(h, position_keys=keys)  # 4 keys, no clamp: 4 distances
    layer(h, position_keys=keys, clamp_len=2)  # distances past 2 share the first column
    with pytest.raises(ValueError, match=r"of shape \(num_heads=2, head_dim=3, K'\)"):
        layer(h, position_keys=np.zeros((4, H * DH), "float32"))  # rows of (K', H * Dh): not this layout


def test_attention_masks_empty_memory_slots():
    run_attention(mem_len=5, valid=2)


def test_attention_pre_lnorm_matches_brute_force():
    run_attention(mem_len=3, pre_lnorm=True)


@pytest.mark.parametrize("pre_lnorm,training", [(False, False), (False, True), (True, True)])
def test_attention_gradients_match_finite_differences_of_the_reference(pre_lnorm, training):
    """The gradients with respect to the segment and to the memory (whose keys and values
    the layer projects by a product of their own) against central differences of the
    numpy reference, in float64; in training (no dropout here) through the softmax's
    written-out gradient (`weighted_values`)."""
    rng = np.random.default_rng(5)
    mem_len = 3
    layer = RelativeAttention(H, DH, pre_lnorm=pre_lnorm)
    h = rng.normal(size=(B, T, D)).astype("float32")
    mem = rng.normal(size=(B, mem_len, D)).astype("float32")
    u, v = rng.normal(size=(2, H, DH)).astype("float32")
    cotangent = rng.normal(size=(B, T, D))
    kwargs = dict(position_encoding=PositionalEmbedding(D)(relative_positions(T + mem_len)), content_bias=u,
                  position_bias=v, attention_mask=causal_attention_mask(T, mem_len))
    layer(h, memory=mem, **kwargs)
    randomize(layer)
    weights = attention_weights(layer)

    def loss(segment, memory):
        out = reference.relative_attention(segment, memory, weights, H, DH, u=u, v=v, pre_lnorm=pre_lnorm)
        return (out * cotangent).sum()

    weight = ops.convert_to_tensor(cotangent.astype("float32"))
    got_memory = gradient(lambda x: layer(h, memory=x, training=training, **kwargs) * weight, mem)
    got_segment = gradient(lambda x: layer(x, memory=mem, training=training, **kwargs) * weight, h)
    want_memory = central_differences(lambda x: loss(h.astype(np.float64), x), mem)
    want_segment = central_differences(lambda x: loss(x, mem.astype(np.float64)), h)
    assert np.abs(want_memory).max() > 0.1  # the memory does move the output
    np.testing.assert_allclose(got_memory, want_memory, rtol=1e-3, atol=2e-4)
    np.testing.assert_allclose(got_segment, want_segment, rtol=1e-3, atol=2e-4)


def test_query_key_scores_gradients_match_finite_differences():
    """`query_key_scores` (queries @ keys^T, the keys' gradient computed transposed): its
    values against numpy, and its gradients with respect to both operands, with an
    upstream gradient that is not 1 and two batch axes, against central differences in
    float64."""
    rng = np.random.default_rng(8)
    q = rng.normal(size=(2, 3, 4, 5)).astype("float32")
    k = rng.normal(size=(2, 3, 6, 5)).astype("float32")
    cotangent = rng.normal(size=(2, 3, 4, 6))
    weight = ops.convert_to_tensor(cotangent.astype("float32"))
    np.testing.assert_allclose(to_np(relative_attention.query_key_scores(ops.array(q), ops.array(k))),
                               q @ np.swapaxes(k, -1, -2), rtol=1e-5, atol=1e-5)
    # (x * 1: a tensor, not TF's variable, as the layer passes)
    got_q = gradient(lambda x: relative_attention.query_key_scores(ops.multiply(x, 1.0), ops.array(k)) * weight, q)
    got_k = gradient(lambda x: relative_attention.query_key_scores(ops.array(q), ops.multiply(x, 1.0)) * weight, k)
    want_q = central_differences(lambda x: ((x @ np.swapaxes(k, -1, -2)) * cotangent).sum(), q)
    want_k = central_differences(lambda x: ((q @ np.swapaxes(x, -1, -2)) * cotangent).sum(), k)
    np.testing.assert_allclose(got_q, want_q, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(got_k, want_k, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("learned", [False, True])
def test_attention_in_head_groups_matches_brute_force(monkeypatch, learned):
    """Outside training, heads whose scores exceed SCORE_BYTES go one group at a time."""
    monkeypatch.setattr(relative_attention, "SCORE_BYTES", 4 * B * T * (T + 6))  # one head's scores
    assert relative_attention._head_group(4, B, T, T + 6) == 1
    assert relative_attention._head_group(4, B, T, T + 1) == 2
    assert relative_attention._head_group(3, B, T, T + 2) == 1
    if learned:
        test_learned_relative_positions_match_brute_force(memory=6)
    else:
        run_attention(mem_len=6, clamp_len=2, window=5, valid=4, clamped_call=True, position_keys=True)


def test_learned_relative_positions_match_brute_force(memory=3):
    rng = np.random.default_rng(2)
    m = memory
    k = T + m
    layer = RelativeAttention(H, DH, position_projection=False)
    h = rng.normal(size=(B, T, D)).astype("float32")
    mem = rng.normal(size=(B, m, D)).astype("float32")
    r = rng.normal(size=(k, H, DH)).astype("float32")  # row c: distance k-1-c
    r_bias = rng.normal(size=(k, H)).astype("float32")
    u = rng.normal(size=(H, DH)).astype("float32")
    mask = causal_attention_mask(T, m)
    layer(h, memory=mem, position_encoding=r, content_bias=u, position_score_bias=r_bias,
          attention_mask=mask)
    randomize(layer)
    got = to_np(layer(h, memory=mem, position_encoding=r, content_bias=u,
                      position_score_bias=r_bias, attention_mask=mask))
    want = reference.relative_attention(
        h.astype(np.float64), mem.astype(np.float64), attention_weights(layer), H, DH, u=u,
        r_table=lambda d: r[k - 1 - d], r_bias_table=lambda d: r_bias[k - 1 - d])
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_attention_serialization_round_trip():
    layer = RelativeAttention(H, DH, dropout=0.1, attention_dropout=0.2, pre_lnorm=True,
                              kernel_initializer=keras.initializers.RandomNormal(0, 0.02))
    clone = RelativeAttention.from_config(layer.get_config())
    assert clone.get_config() == layer.get_config()
    restored = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(layer))
    assert isinstance(restored, RelativeAttention) and restored.attention_dropout == 0.2


def test_attention_dropout_only_in_training():
    layer = RelativeAttention(H, DH, dropout=0.5, attention_dropout=0.5)
    h = np.random.default_rng(0).normal(size=(B, T, D)).astype("float32")
    pos = PositionalEmbedding(D)(relative_positions(T))
    a = to_np(layer(h, position_encoding=pos, attention_mask=causal_attention_mask(T, 0)))
    b = to_np(layer(h, position_encoding=pos, attention_mask=causal_attention_mask(T, 0)))
    c = to_np(layer(h, position_encoding=pos, attention_mask=causal_attention_mask(T, 0),
                    training=True))
    np.testing.assert_array_equal(a, b)
    assert np.abs(a - c).max() > 1e-3


@pytest.mark.parametrize("grouped", [False, True])
def test_a_memory_ring_equals_its_rows_in_time_order(monkeypatch, grouped):
    """`memory_ring`: a wrapped ring with more slots than rows, joined to the segment's
    keys and values by the layer (one head group at a time when the scores exceed
    SCORE_BYTES), attends like its last rows in time order (numpy's roll) passed
    concatenated with the segment's in `context_kv`."""
    capacity, rows, offset = 9, 6, 4
    if grouped:
        monkeypatch.setattr(relative_attention, "SCORE_BYTES", 4 * B * T * (T + rows))  # one head's scores
    assert (relative_attention._head_group(H, B, T, T + rows) == 1) == grouped
    rng = np.random.default_rng(5)
    layer = RelativeAttention(H, DH)
    h = rng.normal(size=(B, T, D)).astype("float32")
    layer.build(h.shape)
    randomize(layer)
    ring = rng.normal(size=(2 * H, B, capacity, DH)).astype("float32")
    queries, segment_kv = layer.project_qkv(h)
    segment = to_np(head_major(segment_kv, H)).astype("float32")
    ordered = np.roll(ring, -offset, axis=2)[:, :, capacity - rows:]
    joined = np.concatenate([ordered, segment], axis=2)
    kwargs = dict(queries=queries, position_encoding=rng.normal(size=(T + rows, D)).astype("float32"),
                  content_bias=rng.normal(size=(H, DH)).astype("float32"),
                  position_bias=rng.normal(size=(H, DH)).astype("float32"),
                  attention_mask=ops.array(rng.random((T, T + rows)) < 0.8))
    want = layer(h, context_kv=(joined[:H], joined[H:]), **kwargs)
    got = layer(h, context_kv=(segment[:H], segment[H:]), memory_ring=(ring, np.int32(offset)),
                memory_ring_rows=rows, **kwargs)
    np.testing.assert_allclose(to_np(got), to_np(want), rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="head-major"):
        layer(h, context_kv=segment_kv, memory_ring=(ring, np.int32(offset)), **kwargs)
