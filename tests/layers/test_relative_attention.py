import keras
import numpy as np
import pytest
from conftest import attention_weights, central_differences, gradient, randomize, to_np
from keras import ops

import reference
from txl_keras import kernels
from txl_keras.layers import (
    InferenceCache,
    PositionalEmbedding,
    RelativeAttention,
    causal_attention_mask,
    relative_attention,
    relative_positions,
)
from txl_keras.layers.inference_cache import head_major

B, T, H, DH, D = 2, 4, 2, 3, 8


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


def as_cache(layer, memory, capacity=None, offset=0, position_keys=None):
    """An `InferenceCache` of one layer whose ring holds the keys and values of `memory`
    `(B, M, D)` as its last M rows in time order, the oldest at slot `offset` of a ring of
    `capacity` slots (default M; the free slots hold noise)."""
    rows = 0 if memory is None else memory.shape[1]
    capacity = capacity or rows
    ring = np.random.default_rng(9).normal(size=(2 * H, B, capacity, DH)).astype("float32")
    if rows:
        kv = to_np(head_major(layer.project_kv(memory), 2 * H))
        ordered = np.concatenate([ring[:, :, : capacity - rows], kv], axis=2)  # time order, oldest first
        ring = np.roll(ordered, offset, axis=2).astype("float32")
    keys = () if position_keys is None else (position_keys,)
    return InferenceCache((ops.convert_to_tensor(ring),), ops.convert_to_tensor(offset, "int32"),
                          ops.convert_to_tensor(rows, "int32"), keys)


def run_attention(mem_len, clamp_len=-1, window=None, valid=None, pre_lnorm=False, clamped_call=False,
                  cached=False, position_keys=False, capacity=None, offset=0):
    """The layer against the brute force; `clamped_call` passes it `clamp_len` (the fast
    kernels then score the distinct distances only). `cached` runs `call_with_cache`, the
    memory's keys and values in a ring (`capacity` slots, the oldest at `offset`), with
    `position_keys` the projected keys of only the distances it needs."""
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
    kwargs = dict(content_bias=u, position_bias=v, attention_mask=mask,
                  clamp_len=clamp_len if clamped_call else None)
    if cached:
        keys = layer.project_positions(pos[k - clamp_len - 1:]) if position_keys else None
        cache = as_cache(layer, mem, capacity, offset, keys)
        got, segment_kv = layer.call_with_cache(h, cache, 0, mem_len, position_encoding=pos, **kwargs)
        np.testing.assert_allclose(to_np(segment_kv), to_np(layer.project_kv(h)), rtol=1e-5, atol=1e-5)
    else:
        got = layer(h, memory=mem, position_encoding=pos, **kwargs)
    want = reference.relative_attention(
        h.astype(np.float64), None if mem is None else mem.astype(np.float64),
        attention_weights(layer), H, DH, u=u, v=v, clamp_len=clamp_len, window=window,
        valid=valid, pre_lnorm=pre_lnorm)
    np.testing.assert_allclose(to_np(got), want, rtol=1e-4, atol=1e-4)


@pytest.fixture(params=["fast", "reference"])
def kernel_choice(request):
    """Each test twice: with the fast kernels and with the plain computation."""
    if request.param == "fast":
        yield request.param
        return
    with kernels.reference_kernels():
        yield request.param


def test_attention_without_memory_matches_brute_force(kernel_choice):
    run_attention(mem_len=0)


def test_attention_with_memory_matches_brute_force(kernel_choice):
    run_attention(mem_len=5)


def test_attention_same_length_matches_brute_force(kernel_choice):
    run_attention(mem_len=5, window=5)  # TF convention: mem_len + 1 keys
    run_attention(mem_len=5, window=4)  # PyTorch convention: mem_len keys


def test_attention_clamp_len_matches_brute_force(kernel_choice):
    run_attention(mem_len=5, clamp_len=2)


@pytest.mark.parametrize("mem_len,pre_lnorm", [(5, False), (5, True), (0, False)])
def test_cached_attention_matches_brute_force(mem_len, pre_lnorm, kernel_choice):
    """`call_with_cache`: the memory as its keys and values in a ring, the segment's
    queries, keys and values from one product (the frozen-weight path of evaluation and
    generation)."""
    run_attention(mem_len=mem_len, window=5, valid=min(mem_len, 4), pre_lnorm=pre_lnorm, cached=True)


@pytest.mark.parametrize("mem_len,clamp_len,window,valid,cached", [
    (5, 2, None, None, False),  # K 9: only the last clamp_len + T = 6 keys are shifted
    (6, 1, 5, 4, True),         # same_length, empty slots, keys of the 2 distinct distances
    (2, 2, None, None, True),   # clamp_len + T = K: every key shifted, 3 distinct of 6
    (1, 3, None, None, False),  # clamp_len + 1 > K: nothing to save, the plain path
])
def test_attention_scores_only_the_distinct_clamped_distances(mem_len, clamp_len, window, valid, cached,
                                                              kernel_choice):
    run_attention(mem_len=mem_len, clamp_len=clamp_len, window=window, valid=valid, clamped_call=True,
                  cached=cached, position_keys=cached)


def test_cached_attention_rejects_position_keys_too_short_or_of_another_layout():
    layer = RelativeAttention(H, DH)
    h = np.zeros((B, T, D), "float32")
    layer(h)

    def cache(keys):
        return InferenceCache((ops.zeros((2 * H, B, 0, DH)),), ops.array(0, "int32"), ops.array(0, "int32"), (keys,))

    keys = np.zeros((H, DH, 3), "float32")
    with pytest.raises(ValueError, match="at least 4 columns"):
        layer.call_with_cache(h, cache(keys), 0, 0)  # 4 keys, no clamp: 4 distances
    layer.call_with_cache(h, cache(keys), 0, 0, clamp_len=2)  # distances past 2 share the first column
    with pytest.raises(ValueError, match=r"of shape \(num_heads=2, head_dim=3, K'\)"):
        layer.call_with_cache(h, cache(np.zeros((4, H * DH), "float32")), 0, 0)  # rows of (K', H * Dh)


def test_attention_masks_empty_memory_slots(kernel_choice):
    run_attention(mem_len=5, valid=2)


def test_attention_pre_lnorm_matches_brute_force(kernel_choice):
    run_attention(mem_len=3, pre_lnorm=True)


@pytest.mark.parametrize("pre_lnorm,training", [(False, False), (False, True), (True, True)])
def test_attention_gradients_match_finite_differences_of_the_reference(pre_lnorm, training, kernel_choice):
    """The gradients with respect to the segment and to the memory (whose keys and values
    the layer projects by a product of their own) against central differences of the
    numpy reference, in float64; in training (no dropout here) through the softmax's
    written-out gradient (`kernels.softmax_values`), or the plain autodiff ones."""
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


@pytest.mark.parametrize("learned", [False, True])
def test_attention_in_head_groups_matches_brute_force(monkeypatch, learned):
    """Outside training, heads whose scores exceed SCORE_BYTES go one group at a time."""
    monkeypatch.setattr(relative_attention, "SCORE_BYTES", 4 * B * T * (T + 6))  # one head's scores
    assert relative_attention._head_group(4, B, T, T + 6) == 1
    assert relative_attention._head_group(4, B, T, T + 1) == 2
    assert relative_attention._head_group(3, B, T, T + 2) == 1
    if learned:
        test_learned_relative_positions_match_brute_force("fast", memory=6, cached=True)
    else:
        run_attention(mem_len=6, clamp_len=2, window=5, valid=4, clamped_call=True, cached=True,
                      position_keys=True)


def test_learned_relative_positions_match_brute_force(kernel_choice, memory=3, cached=False):
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
    if cached:
        got, _ = layer.call_with_cache(h, as_cache(layer, mem), 0, m, position_encoding=r, content_bias=u,
                                       position_score_bias=r_bias, attention_mask=mask)
    else:
        got = layer(h, memory=mem, position_encoding=r, content_bias=u, position_score_bias=r_bias,
                    attention_mask=mask)
    got = to_np(got)
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
def test_a_wrapped_ring_equals_its_rows_in_time_order(monkeypatch, grouped):
    """A ring with more slots than rows whose oldest row is not in slot 0, joined to the
    segment's keys and values by the layer (one head group at a time when the scores
    exceed SCORE_BYTES), attends like its rows in time order."""
    if grouped:
        monkeypatch.setattr(relative_attention, "SCORE_BYTES", 4 * B * T * (T + 6))  # one head's scores
    assert (relative_attention._head_group(H, B, T, T + 6) == 1) == grouped
    run_attention(mem_len=6, window=5, valid=5, cached=True, capacity=9, offset=4)
