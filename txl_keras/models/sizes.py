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


# What a process running frozen weights holds beyond them and its tensors (the allocator's
# pools, traced graphs, thread stacks), and what compiling a forward pass with XLA adds:
# calibrated by bench/memory_estimates.py.
RUNTIME_BYTES = 500 << 20
XLA_BYTES = 300 << 20
EXPORT_BYTES = 200 << 20  # tracing and writing a SavedModel's signatures, beyond inference_bytes


def training_bytes(config, batch_per_replica, replicas=1):
    """An estimate, from above, of the memory one process needs to train `config` with
    `batch_per_replica` streams on each of `replicas` local replicas (bench/memory_estimates.py
    checks it against the peak measured: at most 1.5 times it): ten float32 copies of the
    weights (the weights, their initial values, the gradients of each concurrent part,
    Adam's two moments and the update's temporaries), per replica the activations a
    backward pass keeps (a few tensors per layer the size of the hidden states, the
    feed-forward's inner activations and the attention scores) and the memory, and
    `RUNTIME_BYTES`."""
    parameters = parameter_count(config)
    tokens = batch_per_replica * config.tgt_len
    keys = config.tgt_len + config.mem_len
    per_layer = tokens * (8 * config.d_model + 2 * config.d_inner) + \
        2 * batch_per_replica * config.n_head * config.tgt_len * keys
    memory = batch_per_replica * config.mem_len * config.d_model * config.n_layer
    head = tokens * (config.cutoffs[0] if config.cutoffs else config.n_token)
    return 4 * (10 * parameters + replicas * (config.n_layer * per_layer + memory + 2 * head)) + RUNTIME_BYTES


def inference_bytes(config, batch_size, mem_len=None, segment_length=None, scored_tokens=None,
                    beam_search=False, compiled=False):
    """An estimate, from above, of the memory (bytes) a process needs, beyond what it held
    after importing txl_keras, to run frozen weights of `config` on `batch_size` streams
    (evaluation, scoring, generation, export), checked by bench/memory_estimates.py
    against the peak measured on the bench's models (at most 1.5 times it).

    It counts the float32 weights; each layer's ring of memory keys and values and its
    position keys, twice (a segment's cache is made while the one it replaces exists; three
    times with `beam_search`, which reorders them); one segment of `segment_length` tokens
    (default `tgt_len`): its attention scores and feed-forward; the log-probabilities:
    of `scored_tokens` tokens at once when whole distributions are computed (generation:
    one per stream; an evaluation: the segments it scores together), else each segment's
    NLL; `RUNTIME_BYTES`, and `XLA_BYTES` when the forward pass is `compiled`."""
    mem = config.mem_len if mem_len is None else mem_len
    rows = segment_length or config.tgt_len
    keys = mem + rows
    rings = config.n_layer * batch_size * mem * 2 * config.d_model
    positions = (config.n_layer + 1) * keys * config.d_model
    scores = 4 * batch_size * config.n_head * rows * keys  # AC, BD, their shifted sum, the probabilities
    hidden = batch_size * rows * (8 * config.d_model + 2 * config.d_inner)
    head = _head_width(config) * (3 * scored_tokens if scored_tokens else 2 * batch_size * rows)
    copies = 3 if beam_search else 2
    floats = copies * (rings + positions) + scores + hidden + head
    return 4 * parameter_count(config) + 4 * floats + RUNTIME_BYTES + (XLA_BYTES if compiled else 0)


def _head_width(config):
    """The widest logits one token's log-probabilities need at once: the whole vocabulary,
    or the head cluster and the widest tail."""
    if not config.cutoffs:
        return config.n_token
    edges = [0] + list(config.cutoffs) + [config.n_token]
    return config.cutoffs[0] + len(config.cutoffs) + max(b - a for a, b in zip(edges[1:], edges[2:]))


class MemoryEstimateError(ValueError):
    """A run whose estimated memory exceeds what this machine has available."""


def require_memory(needed, what, override="--check_memory=false"):
    """Refuse, with the figures, work that needs more than the memory available here."""
    available = available_bytes()
    if available is not None and needed > available:
        raise MemoryEstimateError(
            f"{what} needs about {needed / 1e9:,.1f} GB of memory but {available / 1e9:,.1f} GB are available; "
            f"make the batch or the memory (--mem_len) smaller (or pass {override} to try anyway).")


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
