"""The attention kernels against their references: values and gradients, in float64 where
gradients are compared with central differences."""

import numpy as np
import pytest
from conftest import central_differences, gradient, randomize, to_np
from keras import ops

import reference
from txl_keras import kernels
from txl_keras.kernels import attention
from txl_keras.layers import RelativeAttention, causal_attention_mask

RNG = np.random.default_rng(11)


def tensors(*shapes):
    return [RNG.normal(size=shape).astype("float32") for shape in shapes]


def weighted_gradients(fn, args, cotangent):
    """The gradient of `sum(fn(*args) * cotangent)` with respect to each argument."""
    weight = ops.convert_to_tensor(cotangent.astype("float32"))
    grads = []
    for k in range(len(args)):
        def f(v, k=k):  # (v * 1: a tensor, not TF's variable, as the layers pass)
            values = [ops.convert_to_tensor(a) for a in args]
            values[k] = ops.multiply(v, 1.0)
            return ops.multiply(ops.cast(fn(*values), "float32"), weight)
        grads.append(gradient(f, args[k]))
    return grads


def test_query_key_scores_equal_the_reference_and_central_differences():
    """The keys' gradient computed transposed: values against numpy, both gradients against
    central differences in float64, with an upstream gradient that is not 1 and two batch axes."""
    q, k = tensors((2, 3, 4, 5), (2, 3, 6, 5))
    cotangent = RNG.normal(size=(2, 3, 4, 6))
    np.testing.assert_allclose(to_np(kernels.query_key_scores(q, k)), q @ np.swapaxes(k, -1, -2), rtol=1e-5,
                               atol=1e-5)
    got_q, got_k = weighted_gradients(kernels.query_key_scores, [q, k], cotangent)
    want_q = central_differences(lambda x: ((x @ np.swapaxes(k, -1, -2)) * cotangent).sum(), q)
    want_k = central_differences(lambda x: ((q @ np.swapaxes(x, -1, -2)) * cotangent).sum(), k)
    np.testing.assert_allclose(got_q, want_q, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(got_k, want_k, rtol=1e-4, atol=1e-4)
    for got, want in zip((got_q, got_k), weighted_gradients(kernels.query_key_scores_reference, [q, k], cotangent)):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_softmax_values_equal_the_reference_with_their_gradients():
    scores, values = tensors((2, 3, 4, 7), (2, 3, 7, 5))
    scores[..., -2:] += -1e30 * (RNG.random((2, 3, 4, 2)) < 0.5)  # masked keys
    cotangent = RNG.normal(size=(2, 3, 4, 5))
    want = to_np(kernels.softmax_values_reference(scores, values))
    np.testing.assert_allclose(want, reference.softmax(scores.astype(np.float64)) @ values, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(to_np(kernels.softmax_values(scores, values)), want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(to_np(attention.softmax_values_forward(scores, values)), want, rtol=1e-5, atol=1e-6)
    for got, expected in zip(weighted_gradients(kernels.softmax_values, [scores, values], cotangent),
                             weighted_gradients(kernels.softmax_values_reference, [scores, values], cotangent)):
        np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)


def brute_position_scores(q, keys, key_length, bias=None):
    """`[h, b, i, j]` = `q[h, b, i] . keys[h, :, distance column]` (+ bias) for distance
    `M + i - j`, distances past `P - 1` taking column 0, computed pair by pair."""
    heads, batch, length, _ = q.shape
    count = keys.shape[-1]
    out = np.zeros((heads, batch, length, key_length))
    memory = key_length - length
    for i in range(length):
        for j in range(memory + i + 1):  # the unmasked region
            column = max(0, count - 1 - (memory + i - j))
            out[:, :, i, j] = np.einsum("hbd,hd->hb", q[:, :, i], keys[:, :, column])
            if bias is not None:
                out[:, :, i, j] += bias[:, column][:, None]
    return out


@pytest.mark.parametrize("length,key_length,count,bias", [
    (4, 9, 9, False),  # every distance
    (4, 9, 3, False),  # clamped: the last 2 + 4 keys shifted, the older ones take column 0
    (3, 6, 6, True),   # with a score bias per distance (attn_type 1)
    (4, 6, 3, False),  # clamp_len + T = K
])
def test_position_scores_equal_the_reference_and_the_pairwise_definition(length, key_length, count, bias):
    q, keys = tensors((2, 3, length, 5), (2, 5, count))
    score_bias = RNG.normal(size=(2, count)).astype("float32") if bias else None
    cotangent = RNG.normal(size=(2, 3, length, key_length))
    cotangent *= to_np(causal_attention_mask(length, key_length - length))  # garbage above the diagonal
    fast = to_np(kernels.position_scores(q, keys, key_length, score_bias))
    plain = to_np(kernels.position_scores_reference(q, keys, key_length, score_bias))
    brute = brute_position_scores(q.astype(np.float64), keys, key_length, score_bias)
    allowed = to_np(causal_attention_mask(length, key_length - length)).astype(bool)
    np.testing.assert_allclose(fast[..., allowed], brute[..., allowed], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(plain[..., allowed], brute[..., allowed], rtol=1e-5, atol=1e-5)
    fn = lambda q, k: kernels.position_scores(q, k, key_length, score_bias)  # noqa: E731
    ref = lambda q, k: kernels.position_scores_reference(q, k, key_length, score_bias)  # noqa: E731
    for got, want in zip(weighted_gradients(fn, [q, keys], cotangent), weighted_gradients(ref, [q, keys], cotangent)):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("training", [False, True])
@pytest.mark.parametrize("clamped", [False, True])
def test_relative_attention_equals_the_layers_plain_attention(training, clamped):
    """`kernels.relative_attention` against `RelativeAttention.attention` with the fast
    kernels off (the paper's computation): values, and in training the gradients with
    respect to every input."""
    heads, batch, length, key_length, dim = 2, 3, 4, 9, 5
    layer = RelativeAttention(heads, dim)
    layer.build((batch, length, 8))
    randomize(layer)
    q, k, v = tensors((heads, batch, length, dim), (heads, batch, key_length, dim), (heads, batch, key_length, dim))
    keys, u, bias_v = tensors((heads, dim, 3 if clamped else key_length), (heads, dim), (heads, dim))
    mask = causal_attention_mask(length, key_length - length, ops.array(7, "int32"), 6)
    cotangent = RNG.normal(size=(heads, batch, length, dim))

    def run(queries, keys_, values, position_keys, content_bias, position_bias):
        return layer.attention(queries, keys_, values, position_keys, content_bias, position_bias,
                               attention_mask=mask, training=training)

    args = [q, k, v, keys, u, bias_v]
    fast = to_np(run(*args))
    with kernels.reference_kernels():
        plain = to_np(run(*args))
        plain_grads = weighted_gradients(run, args, cotangent) if training else []
    np.testing.assert_allclose(fast, plain, rtol=1e-5, atol=1e-5)
    for got, want in zip(weighted_gradients(run, args, cotangent) if training else [], plain_grads):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("offset,capacity,length,written", [
    (0, 7, 1, None), (3, 7, 1, None), (5, 9, 3, None),
    # written slots just before `offset`: only they and one initial row are read (TensorFlow)
    (3, 6, 1, 3), (5, 6, 1, 2), (4, 9, 2, 4), (0, 6, 1, 0), (8, 9, 1, 7),
    # written slots around the ring's end, or all of them: the whole ring
    (2, 6, 1, 4), (3, 6, 1, 6)])
def test_attention_to_a_ring_in_place_equals_the_paper_on_the_memory_in_time_order(offset, capacity, length, written):
    """`ring_relative_attention` against numpy: the ring's last M rows put in time order and
    joined to the segment, every score `(q + u) k_j + (q + v) W_R R_{M+i-j}` (a clamped
    encoding), rows with their own count of real memory slots, softmax, values. With
    `written`, the slots not written hold one initial row (per head and stream)."""
    heads, batch, dim, memory, clamp = 2, 3, 4, 6, 4
    q, ring_k, ring_v, seg_k, seg_v = tensors((heads, batch, length, dim), (heads, batch, capacity, dim),
                                              (heads, batch, capacity, dim), (heads, batch, length, dim),
                                              (heads, batch, length, dim))
    if written is not None:
        initial = (np.arange(capacity) - offset) % capacity < capacity - written  # the oldest slots
        ring_k[:, :, initial], ring_v[:, :, initial] = ring_k[:, :, :1], ring_v[:, :, :1] * 0 + 0.5
    u, v = tensors((heads, dim), (heads, dim))
    position_keys, = tensors((heads, dim, clamp + 1))  # distances clamp, ..., 0
    valid = np.array([6, 2, 0], "int32")
    mask = to_np(causal_attention_mask(length, memory, ops.convert_to_tensor(valid)))  # (B, T, M + T)
    got = to_np(kernels.ring_relative_attention(q, ring_k, ring_v, ops.convert_to_tensor(offset, "int32"), memory,
                                                seg_k, seg_v, position_keys, u, v, mask=mask,
                                                written=None if written is None else ops.convert_to_tensor(
                                                    written, "int32")))
    in_time = lambda ring: np.roll(ring, -offset, axis=2)[:, :, capacity - memory:]  # noqa: E731
    keys = np.concatenate([in_time(ring_k), seg_k], axis=2).astype("float64")
    values = np.concatenate([in_time(ring_v), seg_v], axis=2).astype("float64")
    want = np.zeros((heads, batch, length, dim))
    for h in range(heads):
        for b in range(batch):
            for i in range(length):
                scores = np.full(memory + length, -np.inf)
                for j in range(memory + length):
                    if mask[b, i, j]:
                        column = clamp - min(memory + i - j, clamp)
                        scores[j] = ((q[h, b, i] + u[h]) @ keys[h, b, j]
                                     + (q[h, b, i] + v[h]) @ position_keys[h, :, column]) / dim**0.5
                weights = np.exp(scores - scores.max())
                want[h, b, i] = weights @ values[h, b] / weights.sum()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
