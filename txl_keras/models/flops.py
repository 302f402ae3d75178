"""Model FLOPs per token: what the trainer logs as model FLOP/s and the benchmarks use
for MFU (model FLOPs utilisation)."""


def softmax_macs_per_token(config, cluster_shares=None):
    """Multiply-adds of the output layer per token: `d V` for a full softmax; for an
    adaptive one, the head (with its cluster logits) plus each tail cluster's projection
    and logits, weighted by how often its tokens occur: `cluster_shares[i]` for tail `i`
    (default: its share of the vocabulary, as in uniformly random data)."""
    d, V, cutoffs = config.d_model, config.n_token, list(config.cutoffs)
    if not cutoffs:
        return d * V
    bounds = [0] + cutoffs + [V]
    macs = 0.0
    for i in range(len(bounds) - 1):
        size, width = bounds[i + 1] - bounds[i], config.d_embed // config.div_val ** i
        columns = size + (len(cutoffs) if i == 0 else 0)
        if i == 0:
            share = 1.0
        else:
            share = size / V if cluster_shares is None else cluster_shares[i - 1]
        macs += share * (d * width + width * columns)
    return macs


def model_flops_per_token(config, training=True, mem_len=None, tgt_len=None, cluster_shares=None):
    """6 N_nonembedding + 6 (softmax multiply-adds) + 18 L d (m + (q + 1) / 2) for a
    training step (the formula of the reference benchmark); a third of it for a forward
    pass. `mem_len`, `tgt_len` default to the config's."""
    d, L = config.d_model, config.n_layer
    m = config.mem_len if mem_len is None else mem_len
    q = config.tgt_len if tgt_len is None else tgt_len
    inner = config.n_head * config.d_head
    n_nonembedding = L * (5 * d * inner + 2 * d * config.d_inner + config.d_inner + 5 * d)
    flops = 6 * n_nonembedding + 6 * softmax_macs_per_token(config, cluster_shares) + 18 * L * d * (m + (q + 1) / 2)
    return flops if training else flops / 3
