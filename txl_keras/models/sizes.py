"""How large a model is before it is built: its parameters, and the memory a training
step needs (weights, gradients, Adam's moments, activations), so that a run that cannot
fit the machine is refused with the figures instead of failing after minutes or hours."""

import os


def _cluster_widths(config):
    bounds = [0] + list(config.cutoffs) + [config.n_token]
    widths = [config.d_embed if config.div_val == 1 else config.d_embed // config.div_val**i
              for i in range(len(bounds) - 1)]
    return bounds, widths


def embedding_parameters(config):
    """The adaptive embedding's tables and projections (`AdaptiveEmbedding`)."""
    if config.div_val == 1:
        projection = config.d_embed * config.d_model if config.d_embed != config.d_model else 0
        return config.n_token * config.d_embed + projection
    bounds, widths = _cluster_widths(config)
    total = 0
    for i, width in enumerate(widths):
        total += (bounds[i + 1] - bounds[i]) * width
        if not (width == config.d_model and not config.proj_same_dim):
            total += width * config.d_model
    return total


def softmax_parameters(config):
    """The adaptive softmax's own weights (biases, cluster logits, untied projections and
    tables; tied ones belong to the embedding)."""
    bounds, widths = _cluster_widths(config)
    total = config.n_token
    if config.cutoffs:
        total += len(config.cutoffs) * (config.d_embed + 1)
    for i, (width, tied) in enumerate(zip(widths, config.resolved_tie_projs)):
        skip = (config.div_val == 1 or not config.proj_same_dim) and width == config.d_model
        if not tied and not skip:
            total += width * config.d_model
        if not config.tie_weight and (config.div_val > 1 or i == 0):
            total += (config.n_token if config.div_val == 1 else bounds[i + 1] - bounds[i]) * width
    return total


def layer_parameters(config):
    """One `TransformerXLBlock`: attention kernels, feed-forward, two layer norms."""
    d, inner = config.d_model, config.n_head * config.d_head
    attention = d * 3 * inner + inner * d + (d * inner if config.attn_type == 0 else 0) + 2 * d
    feed_forward = d * config.d_inner + config.d_inner + config.d_inner * d + d + 2 * d
    return attention + feed_forward


def position_parameters(config):
    """The global biases and learned position tables of `config.attn_type`."""
    heads = config.n_head * config.d_head
    if config.attn_type == 0:
        return 2 * heads * (config.n_layer if config.untie_r else 1)
    if config.attn_type == 1:
        return config.n_layer * (heads + config.max_klen * heads + config.max_klen * config.n_head)
    if config.attn_type == 3:
        return config.n_layer * config.max_klen * config.d_model
    return 0


def parameter_count(config):
    """Every trainable parameter of a `TransformerXLLM` of `config`."""
    return (embedding_parameters(config) + softmax_parameters(config) + config.n_layer * layer_parameters(config)
            + position_parameters(config))


def training_bytes(config, batch_per_replica, replicas=1):
    """A lower bound of the memory one process needs to train `config` with
    `batch_per_replica` streams on each of `replicas` local replicas: float32 weights,
    gradients and Adam's two moments, and per replica the activations a backward pass
    keeps (a few tensors per layer the size of the hidden states, the feed-forward's
    inner activations and the attention scores) and the memory."""
    parameters = parameter_count(config)
    tokens = batch_per_replica * config.tgt_len
    keys = config.tgt_len + config.mem_len
    per_layer = tokens * (8 * config.d_model + 2 * config.d_inner) + \
        2 * batch_per_replica * config.n_head * config.tgt_len * keys
    memory = batch_per_replica * config.mem_len * config.d_model * config.n_layer
    head = tokens * (config.cutoffs[0] if config.cutoffs else config.n_token)
    return 4 * (4 * parameters + replicas * (config.n_layer * per_layer + memory + 2 * head))


def available_bytes():
    """The memory available to a new process here (MemAvailable of /proc/meminfo, else
    the physical memory), or None where the platform does not say."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, OSError, ValueError):
        return None
