import keras
import numpy as np
import pytest
from conftest import central_differences, gradient, randomize, to_np
from keras import ops

import reference
from txl_keras.layers import AdaptiveEmbedding, AdaptiveSoftmax
from txl_keras.kernels import nll as nll_kernels

V, E, D = 20, 8, 6


def make_pair(cutoffs, div_val, tie_projs, proj_same_dim=True, order="tf", tail_mode="auto"):
    emb = AdaptiveEmbedding(V, E, D, cutoffs=cutoffs, div_val=div_val, proj_same_dim=proj_same_dim)
    soft = AdaptiveSoftmax(V, E, D, cutoffs=cutoffs, div_val=div_val, tie_projs=tie_projs,
                           proj_same_dim=proj_same_dim, cluster_order=order, embedding=emb,
                           tail_mode=tail_mode)
    emb.build()
    soft.build()
    randomize(emb, seed=1)
    randomize(soft, seed=2)
    return emb, soft


def reference_clusters(emb, soft):
    clusters = []
    for i in range(soft.n_clusters):
        table, bias, proj = soft.cluster_weights(i)
        table = to_np(table)
        if soft.div_val == 1:  # one table for the whole vocabulary: the cluster's rows
            table = table[soft.bounds[i]:soft.bounds[i + 1]]
        clusters.append((to_np(table), to_np(bias), None if proj is None else to_np(proj)))
    cw = to_np(soft.cluster_W) if soft.cutoffs else None
    cb = to_np(soft.cluster_b) if soft.cutoffs else None
    return clusters, cw, cb


CASES = [
    dict(cutoffs=[], div_val=1, tie_projs=[True]),
    dict(cutoffs=[5, 12], div_val=1, tie_projs=[False, True, True]),
    dict(cutoffs=[5, 12], div_val=1, tie_projs=[True, True, True], order="pytorch"),  # one table and projection
    dict(cutoffs=[5, 12], div_val=2, tie_projs=[False, True, True]),
    dict(cutoffs=[5, 12], div_val=2, tie_projs=[False, False, False], order="pytorch"),
    dict(cutoffs=[4, 8, 16], div_val=2, tie_projs=[False] * 4, proj_same_dim=False),
]


@pytest.mark.parametrize("case", CASES)
def test_log_probs_match_reference_and_sum_to_one(case):
    emb, soft = make_pair(**case)
    h = np.random.default_rng(3).normal(size=(2, 5, D)).astype("float32")
    got = to_np(soft.log_probs(h))
    assert got.shape == (2, 5, V)
    np.testing.assert_allclose(np.exp(got).sum(-1), 1.0, atol=1e-5)
    clusters, cw, cb = reference_clusters(emb, soft)
    want = reference.adaptive_log_probs(h.reshape(-1, D).astype(np.float64), clusters, cw, cb,
                                        case["cutoffs"], V, case.get("order", "tf"))
    np.testing.assert_allclose(got.reshape(-1, V), want, atol=1e-4)


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("tail_mode", ["gather", "dense"])
def test_nll_equals_gathered_log_probs(case, tail_mode):
    emb, soft = make_pair(**case, tail_mode=tail_mode)
    rng = np.random.default_rng(4)
    h = rng.normal(size=(3, 7, D)).astype("float32")
    targets = rng.integers(0, V, size=(3, 7)).astype("int32")
    nll = to_np(soft(h, targets))
    log_probs = to_np(soft.log_probs(h))
    want = -np.take_along_axis(log_probs, targets[..., None], -1)[..., 0]
    np.testing.assert_allclose(nll, want, atol=1e-4)


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("tail_mode", ["gather", "dense"])
def test_nll_without_gradients_taken_piece_by_piece_matches_reference(case, tail_mode, monkeypatch):
    # Pieces of 2-3 rows: every cluster (and the head's tail columns) spans several.
    monkeypatch.setattr(nll_kernels, "PIECE_ALIGN", 1)
    monkeypatch.setattr(nll_kernels, "PIECE_VALUES", 21 * 3)
    monkeypatch.setattr(nll_kernels, "PIECE_ROWS", 2)
    emb, soft = make_pair(**case, tail_mode=tail_mode)
    rng = np.random.default_rng(5)
    h = rng.normal(size=(3, 7, D)).astype("float32")
    targets = rng.integers(0, V, size=(3, 7)).astype("int32")
    clusters, cw, cb = reference_clusters(emb, soft)
    log_probs = reference.adaptive_log_probs(h.reshape(-1, D).astype(np.float64), clusters, cw, cb,
                                             case["cutoffs"], V, case.get("order", "tf"))
    want = -np.take_along_axis(log_probs, targets.reshape(-1, 1), -1).reshape(3, 7)
    np.testing.assert_allclose(to_np(soft(h, targets, training=False)), want, atol=1e-4)
    head_only = targets % soft.bounds[1]  # tail clusters without tokens
    want_head = -np.take_along_axis(log_probs, head_only.reshape(-1, 1), -1).reshape(3, 7)
    np.testing.assert_allclose(to_np(soft(h, head_only, training=False)), want_head, atol=1e-4)
    if keras.config.backend() == "tensorflow":  # unknown token count: pieces of PIECE_ROWS rows
        import tensorflow as tf

        spec = tf.TensorSpec((None, 7, D), "float32"), tf.TensorSpec((None, 7), "int32")
        lean = tf.function(lambda h, t: soft(h, t, training=False), input_signature=spec)
        np.testing.assert_allclose(lean(h, targets).numpy(), want, atol=1e-4)


@pytest.mark.skipif(keras.config.backend() != "tensorflow", reason="counts TensorFlow graph operations")
@pytest.mark.parametrize("cutoffs", [[], [60, 120]])
def test_nll_without_gradients_traces_one_piece_however_many_the_vocabulary_has(cutoffs, monkeypatch):
    """The pieces of the lean NLL go through one loop: its graph (loop bodies included) is
    the same size for 60 pieces as for 20, and both give the gathered log-probabilities."""
    import tensorflow as tf

    vocab = 240  # clusters of 240, or 60 / 60 / 120 words: whole pieces of 4 or 12 rows
    monkeypatch.setattr(nll_kernels, "PIECE_ALIGN", 1)
    soft = AdaptiveSoftmax(vocab, E, D, cutoffs=cutoffs, tie_weight=False, tie_projs=[False] * (len(cutoffs) + 1))
    soft.build()
    randomize(soft, seed=6)
    rng = np.random.default_rng(6)
    h = rng.normal(size=(3, 7, D)).astype("float32")
    targets = rng.integers(0, vocab, size=(3, 7)).astype("int32")
    want = -np.take_along_axis(to_np(soft.log_probs(h)), targets[..., None], -1)[..., 0]
    spec = tf.TensorSpec((None, 7, D), "float32"), tf.TensorSpec((None, 7), "int32")  # rows unknown: PIECE_ROWS
    sizes = []
    for rows in (4, 12):
        monkeypatch.setattr(nll_kernels, "PIECE_ROWS", rows)
        lean = tf.function(lambda h, t: soft(h, t, training=False), input_signature=spec)
        graph = lean.get_concrete_function().graph.as_graph_def()
        sizes.append(len(graph.node) + sum(len(f.node_def) for f in graph.library.function))
        np.testing.assert_allclose(lean(h, targets).numpy(), want, atol=1e-4)
    assert sizes[0] == sizes[1]


@pytest.mark.parametrize("case", CASES[1:3] + CASES[5:])
@pytest.mark.parametrize("tail_mode", ["gather", "dense"])
def test_nll_gradient_matches_finite_differences_of_the_reference(case, tail_mode):
    emb, soft = make_pair(**case, tail_mode=tail_mode)
    rng = np.random.default_rng(8)
    h = rng.normal(size=(12, D)).astype("float32")
    targets = rng.integers(0, V, size=(12,)).astype("int32")
    targets[:3] = V - 1  # the last cluster has tokens
    weights = rng.uniform(0.5, 2.0, size=(12,))
    clusters, cw, cb = reference_clusters(emb, soft)

    def loss(x):  # the weighted NLL in float64, the numpy reference
        log_probs = reference.adaptive_log_probs(x, clusters, cw, cb, case["cutoffs"], V, case.get("order", "tf"))
        return -(log_probs[np.arange(12), targets] * weights).sum()

    want = central_differences(loss, h)
    got = gradient(lambda v: ops.multiply(soft(v, targets), weights.astype("float32")), h)
    np.testing.assert_allclose(got, want, atol=1e-4)


def test_no_cutoffs_is_a_plain_softmax():
    soft = AdaptiveSoftmax(V, D, D, tie_weight=False, tie_projs=[False])
    soft.build()
    randomize(soft)
    assert soft.own_projections[0] is None  # width == d_model: no projection
    rng = np.random.default_rng(5)
    h = rng.normal(size=(4, D)).astype("float32")
    targets = rng.integers(0, V, size=(4,)).astype("int32")
    logits = h @ to_np(soft.own_tables[0]).T + to_np(soft.biases[0])
    want = -reference.log_softmax(logits)[np.arange(4), targets]
    np.testing.assert_allclose(to_np(soft(h[None], targets[None]))[0], want, atol=1e-5)


def test_cluster_order_moves_tail_logits():
    emb, soft_tf = make_pair([5, 12], 2, [False] * 3, order="tf")
    soft_pt = AdaptiveSoftmax(V, E, D, cutoffs=[5, 12], div_val=2, tie_projs=[False] * 3,
                              cluster_order="pytorch", embedding=emb)
    soft_pt.build()
    for a, b in zip(soft_pt.weights, soft_tf.weights):
        a.assign(b)
    # The same weights with the rows of cluster_W swapped give the same distribution.
    soft_pt.cluster_W.assign(ops.flip(soft_tf.cluster_W, 0))
    soft_pt.cluster_b.assign(ops.flip(soft_tf.cluster_b, 0))
    h = np.random.default_rng(6).normal(size=(1, 4, D)).astype("float32")
    np.testing.assert_allclose(to_np(soft_pt.log_probs(h)), to_np(soft_tf.log_probs(h)), atol=1e-5)


@pytest.mark.parametrize("case", CASES)
def test_embedding_matches_reference(case):
    emb, _ = make_pair(**case)
    tokens = np.arange(V).reshape(4, 5).astype("int32")
    tables = [to_np(t) for t in emb.tables]
    projs = [None if p is None else to_np(p) for p in emb.projections]
    want = reference.adaptive_embedding(tokens, tables, projs, case["cutoffs"], V, D, case["div_val"])
    np.testing.assert_allclose(to_np(emb(tokens)), want, atol=1e-4)


EMBEDDING_LAYOUTS = [
    dict(embedding_dim=E, hidden_dim=D, cutoffs=[5, 12], div_val=2),  # every cluster projected
    dict(embedding_dim=8, hidden_dim=8, cutoffs=[5, 12], div_val=2, proj_same_dim=False),  # lm1b: cluster 0 not
    dict(embedding_dim=8, hidden_dim=8, cutoffs=[], div_val=2, proj_same_dim=False),  # no projection at all
]


@pytest.mark.parametrize("layout", EMBEDDING_LAYOUTS)
def test_embedding_gradients_match_finite_differences_of_the_reference(layout):
    """The embedding and the gradient of `sum(embedding * cotangent)` with respect to every
    table and projection, against the numpy reference and its central differences."""
    emb = AdaptiveEmbedding(V, **layout)
    tokens = np.array([[0, 4, 5, 11, 12], [19, 4, 13, 0, 7]], "int32")  # every cluster, repeated rows
    emb.build()
    randomize(emb)
    variables = list(emb.trainable_variables)
    index = {id(v): k for k, v in enumerate(variables)}
    values = [to_np(v) for v in variables]
    hidden = layout["hidden_dim"]
    cotangent = np.random.default_rng(3).normal(size=tokens.shape + (hidden,))

    def reference_loss(k, x):
        vals = values[:k] + [x] + values[k + 1:]
        tables = [vals[index[id(t)]] for t in emb.tables]
        projs = [None if p is None else vals[index[id(p)]] for p in emb.projections]
        out = reference.adaptive_embedding(tokens, tables, projs, layout["cutoffs"], V, hidden, layout["div_val"])
        return (out * cotangent).sum()

    def layer_loss(k):
        def fn(x):
            trainable = variables[:k] + [x] + variables[k + 1:]
            return ops.multiply(emb.stateless_call(trainable, [], tokens)[0], cotangent.astype("float32"))
        return fn

    np.testing.assert_allclose(to_np(ops.sum(layer_loss(0)(variables[0]))), reference_loss(0, values[0]), atol=1e-4)
    for k, value in enumerate(values):
        want = central_differences(lambda x: reference_loss(k, x), value)
        got = gradient(layer_loss(k), value.astype("float32"))
        np.testing.assert_allclose(got, want, atol=1e-4, err_msg=variables[k].path)


def test_embedding_projection_rules():
    assert AdaptiveEmbedding(V, D, D)._built_projections() == [False]
    assert AdaptiveEmbedding(V, E, D)._built_projections() == [True]
    # lm1b: cluster 0 already has width d_model and proj_same_dim is False.
    lm1b = AdaptiveEmbedding(V, 8, 8, cutoffs=[5, 12], div_val=2, proj_same_dim=False)
    assert lm1b._built_projections() == [False, True, True]
    wt103 = AdaptiveEmbedding(V, 8, 8, cutoffs=[5, 12], div_val=2, proj_same_dim=True)
    assert wt103._built_projections() == [True, True, True]


def test_bad_cutoffs_and_div_val_are_refused():
    with pytest.raises(ValueError, match="strictly increasing"):
        AdaptiveEmbedding(V, E, D, cutoffs=[12, 5])
    with pytest.raises(ValueError, match="strictly increasing"):
        AdaptiveEmbedding(V, E, D, cutoffs=[5, 25])
    with pytest.raises(ValueError, match="divisible by div_val"):
        AdaptiveEmbedding(V, 6, D, cutoffs=[5, 12], div_val=4)
    with pytest.raises(ValueError, match="pass `embedding=`"):
        AdaptiveSoftmax(V, E, D, cutoffs=[5], tie_weight=True).build()


def test_serialization_round_trip():
    emb = AdaptiveEmbedding(V, E, D, cutoffs=[5, 12], div_val=2, proj_same_dim=False)
    assert AdaptiveEmbedding.from_config(emb.get_config()).get_config() == emb.get_config()
    soft = AdaptiveSoftmax(V, E, D, cutoffs=[5], tie_weight=False, tie_projs=[False, False],
                           cluster_order="pytorch")
    restored = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(soft))
    assert restored.get_config() == soft.get_config()
