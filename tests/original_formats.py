"""Tiny weights and files in the layouts of the original implementation (TF checkpoints,
cache.pkl), for the conversion tests and the README command tests."""

import os
import pickle
import sys
import types

import numpy as np

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


def write_tf_checkpoint(path, arrays):
    """`arrays` as the original code's TF1 Saver writes them at `path`: every variable with its
    two Adam slots (which conversion drops), `global_step`, and the folder's `checkpoint` file."""
    import tensorflow as tf

    tensors = {"global_step": np.int64(7)}
    for name, value in arrays.items():
        tensors.update({name: value, name + "/Adam": np.zeros_like(value), name + "/Adam_1": np.zeros_like(value)})
    names = sorted(tensors)
    tf.raw_ops.SaveV2(prefix=path, tensor_names=names, shape_and_slices=[""] * len(names),
                      tensors=[tf.constant(tensors[n]) for n in names])
    with open(os.path.join(os.path.dirname(path), "checkpoint"), "w") as f:  # the Saver's text proto
        f.write(f'model_checkpoint_path: "{path}"\nall_model_checkpoint_paths: "{path}"\n')
    reader = tf.train.load_checkpoint(path)  # the file holds every array as given
    for name, value in arrays.items():
        np.testing.assert_array_equal(reader.get_tensor(name), value, err_msg=name)
    return path


CASES = {  # name: (n_token, cutoffs, div_val, d_embed, untie_r, proj_share_all_but_first, proj_same_dim)
    "wt103": (30, [6, 14], 2, D, True, True, True),
    "lm1b": (30, [6, 14], 2, D, True, False, False),
    "enwik8": (20, [], 1, D, False, False, True),
    "div_val_1_adaptive": (30, [6, 14], 1, 12, True, True, True),
}


def write_cache_pkl(path, symbols, unk="<unk>", dataset="wt103", unk_idx=None):
    """A cache.pkl as the original data_utils writes it: a pickled `data_utils.Corpus`
    holding a `vocabulary.Vocab` (classes stubbed here, protocol 2); `unk_idx` overrides
    the unknown symbol's id (a damaged file)."""
    vocabulary, data_utils = types.ModuleType("vocabulary"), types.ModuleType("data_utils")

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
        unk_idx = list(symbols).index(unk) if unk_idx is None else unk_idx
        vocab.__dict__.update(idx2sym=list(symbols), unk_idx=unk_idx, lower_case=False,
                              special=["<eos>"], counter=__import__("collections").Counter(symbols[:2]))
        corpus = Corpus()
        corpus.__dict__.update(vocab=vocab, dataset=dataset, train=np.arange(5))
        with open(path, "wb") as f:
            pickle.dump(corpus, f, protocol=2)
        with open(path, "rb") as f:  # it loads back as the original's classes, with the symbols given
            assert pickle.load(f).vocab.idx2sym == list(symbols)
    finally:
        del sys.modules["vocabulary"], sys.modules["data_utils"]
