"""Independent numpy re-derivations of Transformer-XL from the paper's equations.

Nothing here calls txl_keras: weights come in as numpy arrays, scores are built one
query-key pair at a time from the explicit relative distance (no shift trick), and
the adaptive softmax is assembled as a full distribution.
"""

import numpy as np


def sinusoid(distances, d_model):
    """`[sin(p f) | cos(p f)]`, `f_k = 1/10000**(2k/d)`, one row per distance."""
    assert d_model % 2 == 0, "the encoding has sin and cos halves"
    distances = np.asarray(distances, np.float64)
    inv_freq = 1.0 / 10000 ** (np.arange(0, d_model, 2) / d_model)
    angles = distances[:, None] * inv_freq[None]
    return np.concatenate([np.sin(angles), np.cos(angles)], -1)


def layer_norm(x, gamma, beta, eps):
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * gamma + beta


def softmax(x):
    x = x - x.max(-1, keepdims=True)
    e = np.exp(x)
    return e / e.sum(-1, keepdims=True)


def log_softmax(x):
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def allowed(i, j, mem_len_actual, window=None, valid=None):
    """Query i (at key position M + i) may see key j."""
    d = mem_len_actual + i - j
    ok = d >= 0
    if window is not None:
        ok = ok and d <= window
    if valid is not None:
        ok = ok and j >= mem_len_actual - valid
    return ok


def relative_attention(h, mem, w, n_head, d_head, u=None, v=None, clamp_len=-1,
                       window=None, valid=None, eps=1e-5, pre_lnorm=False,
                       r_table=None, r_bias_table=None):
    """Brute-force relative attention of one layer, with residual and layer norm.

    h: (B, T, D); mem: (B, M, D) or None; w: dict with qkv (D, 3HDh), r (D, HDh) or
    None, o (HDh, D), gamma, beta. For attn_type 1 pass `r_table(d) -> (H, Dh)` and
    `r_bias_table(d) -> (H,)` instead of `w["r"]`.
    """
    B, T, D = h.shape
    M = 0 if mem is None else mem.shape[1]
    cat = h if mem is None else np.concatenate([mem, h], 1)
    ln = lambda x: layer_norm(x, w["gamma"], w["beta"], eps)
    hq = ln(h) if pre_lnorm else h
    ck = ln(cat) if pre_lnorm else cat
    HD = n_head * d_head
    q = (hq @ w["qkv"][:, :HD]).reshape(B, T, n_head, d_head)
    k = (ck @ w["qkv"][:, HD:2 * HD]).reshape(B, M + T, n_head, d_head)
    val = (ck @ w["qkv"][:, 2 * HD:]).reshape(B, M + T, n_head, d_head)
    out = np.zeros((B, T, n_head, d_head))
    for b in range(B):
        for n in range(n_head):
            for i in range(T):
                scores, keys = [], []
                for j in range(M + T):
                    if not allowed(i, j, M, window, valid):
                        continue
                    d = M + i - j
                    qc = q[b, i, n] + (0 if u is None else u[n])
                    s = qc @ k[b, j, n]
                    if r_table is not None:
                        s += q[b, i, n] @ r_table(d)[n] + r_bias_table(d)[n]
                    elif w.get("r") is not None:
                        dd = min(d, clamp_len) if clamp_len > 0 else d
                        r = (sinusoid([dd], D) @ w["r"]).reshape(n_head, d_head)
                        s += (q[b, i, n] + v[n]) @ r[n]
                    scores.append(s / np.sqrt(d_head))
                    keys.append(j)
                p = softmax(np.array(scores))
                out[b, i, n] = sum(pj * val[b, j, n] for pj, j in zip(p, keys))
    o = out.reshape(B, T, HD) @ w["o"]
    return h + o if pre_lnorm else ln(h + o)


def feed_forward(h, w, eps=1e-5, pre_lnorm=False):
    ln = lambda x: layer_norm(x, w["gamma"], w["beta"], eps)
    x = ln(h) if pre_lnorm else h
    x = np.maximum(x @ w["k1"] + w["b1"], 0) @ w["k2"] + w["b2"]
    return h + x if pre_lnorm else ln(h + x)


def adaptive_embedding(tokens, tables, projs, cutoffs, n_token, d_model, div_val):
    bounds = [0] + list(cutoffs) + [n_token]
    out = np.zeros(tokens.shape + (d_model,))
    for idx in np.ndindex(tokens.shape):
        t = tokens[idx]
        if div_val == 1:
            e = tables[0][t]
            p = projs[0]
        else:
            c = max(i for i in range(len(bounds) - 1) if bounds[i] <= t)
            e = tables[c][t - bounds[c]]
            p = projs[c]
        out[idx] = e if p is None else e @ p
    return out * np.sqrt(d_model)


def adaptive_log_probs(hidden, clusters, cluster_W, cluster_b, cutoffs, n_token, order="tf"):
    """Full log-probabilities `(N, n_token)`.

    clusters: list of (table (n_i, w_i), bias (n_i,), proj (w_i, D) or None).
    """
    def logits(h, table, bias, proj):
        x = h if proj is None else h @ proj.T
        return x @ table.T + bias

    bounds = [0] + list(cutoffs) + [n_token]
    n_tail = len(cutoffs)
    table, bias, proj = clusters[0]
    if n_tail:
        table = np.concatenate([table, cluster_W], 0)
        bias = np.concatenate([bias, cluster_b], 0)
    head = log_softmax(logits(hidden, table, bias, proj))
    parts = [head[:, : bounds[1]]]
    for i in range(1, n_tail + 1):
        column = bounds[1] + (i - 1 if order == "tf" else n_tail - i)
        parts.append(head[:, column:column + 1] + log_softmax(logits(hidden, *clusters[i])))
    return np.concatenate(parts, -1)


def model_forward(w, c, tokens, mems=None, valid=None):
    """Hidden states, new memories and full log-probabilities of an attn_type 0 model.

    w: dict of numpy weights (see tests/models/test_transformer_xl_lm.py `numpy_weights`);
    c: the TransformerXLConfig. Memories are the inputs of each layer, last mem_len kept.
    """
    assert c.attn_type == 0 and c.ext_len == 0, "the reference covers the paper's relative attention"
    h = adaptive_embedding(tokens, w["tables"], w["projs"], c.cutoffs, c.n_token, c.d_model, c.div_val)
    window = None
    if c.same_length:
        window = c.mem_len if c.same_length_convention == "tf" else c.mem_len - 1
    new_mems = []
    for i, layer in enumerate(w["layers"]):
        mem = None if mems is None else mems[i]
        joined = h if mem is None else np.concatenate([mem, h], 1)
        new_mems.append(joined[:, max(0, joined.shape[1] - c.mem_len):])
        u = w["r_w_bias"][i] if c.untie_r else w["r_w_bias"]
        v = w["r_r_bias"][i] if c.untie_r else w["r_r_bias"]
        h = relative_attention(h, mem, layer["attn"], c.n_head, c.d_head, u=u, v=v,
                               clamp_len=c.clamp_len, window=window, valid=valid,
                               eps=c.layer_norm_epsilon, pre_lnorm=c.pre_lnorm)
        h = feed_forward(h, layer["ff"], eps=c.layer_norm_epsilon, pre_lnorm=c.pre_lnorm)
    flat = h.reshape(-1, c.d_model)
    log_probs = adaptive_log_probs(flat, w["clusters"], w.get("cluster_W"), w.get("cluster_b"),
                                   c.cutoffs, c.n_token, c.cluster_order)
    return h, new_mems, log_probs.reshape(tokens.shape + (c.n_token,))
