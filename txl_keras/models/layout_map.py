"""`get_layout_map`: how `keras.distribution.ModelParallel` shards a Transformer-XL's weights.

As KerasHub's backbones publish theirs: each attention's heads (the columns of the query, key,
value and position projections, the rows of the output projection), the feed-forward's inner
dimension, and the vocabulary rows of the adaptive embedding's and softmax's clusters go across
the mesh's model axis; the layer norms, the global position biases and the small cluster
projections are replicated. A weight is sharded only where its dimension divides by the model
axis (with `config` given, each cluster is checked; without it, every sharded dimension must
divide). The memory needs no entry: its variables take the batch's layout from the data.
With `quantization="int8"` the layouts are those of the int8 weights (`Int8Model`): the
attention's and feed-forward's kernels are stored as `(out, in)` rows, so their split moves to
the other dimension, and each scale per row follows its rows.
"""

import keras

from txl_keras.layers.adaptive_clusters import cluster_bounds


def get_layout_map(device_mesh, model_parallel_dim_name="model", data_parallel_dim_name="batch", config=None,
                   quantization=None):
    """A `keras.distribution.LayoutMap` of the weights' paths (regular expressions matching
    `TransformerXL`'s and `TransformerXLLM`'s, whatever the model's name) for `device_mesh`,
    whose axes include `model_parallel_dim_name`: the attention heads, the feed-forward's inner
    dimension and the adaptive clusters' vocabulary rows are split over that axis (with
    `config`, only what divides by it). `quantization`: None, or "int8" for a model built
    with int8 weights. Both models' static `get_layout_map`. `data_parallel_dim_name` is
    accepted for KerasHub's signature; the data's layout is the distribution's
    `batch_dim_name`."""
    del data_parallel_dim_name
    if quantization not in (None, "int8"):
        raise ValueError(f"`quantization` must be None or 'int8'. Received: quantization={quantization!r}")
    if model_parallel_dim_name not in device_mesh.axis_names:
        raise ValueError(f"The device mesh has no axis {model_parallel_dim_name!r} (its axes: "
                         f"{list(device_mesh.axis_names)}); name the model-parallel axis.")
    model = model_parallel_dim_name
    shards = device_mesh.shape[list(device_mesh.axis_names).index(model)]

    def divides(n):
        return config is None or n % shards == 0

    int8 = quantization == "int8"
    layout_map = keras.distribution.LayoutMap(device_mesh)

    def columns(pattern):  # a kernel `(in, out)` split by its outputs; int8: `(out, in)` rows and their scales
        layout_map[pattern] = (model, None) if int8 else (None, model)
        if int8:
            layout_map[pattern + "_scale"] = (model,)

    def rows(pattern):  # a kernel `(in, out)` split by its inputs; int8: `(out, in)`, the scales whole
        layout_map[pattern] = (None, model) if int8 else (model, None)

    def table(pattern):  # vocabulary rows (both forms), int8: their scales
        layout_map[pattern] = (model, None)
        if int8:
            layout_map[pattern + "_scale"] = (model,)

    if config is None or divides(config.n_head * config.d_head):
        columns(r".*rel_attn/(qkv|r)_kernel")
        rows(r".*rel_attn/o_kernel")
        layout_map[r".*rel_attn/qkv_lora_b"] = (None, model)
        layout_map[r".*rel_attn/o_lora_a"] = (model, None)
    if config is None or divides(config.d_inner):
        columns(r".*ff/layer_1/kernel")
        layout_map[r".*ff/layer_1/bias"] = (model,)
        rows(r".*ff/layer_2/kernel")
    if config is None:
        table(r".*adaptive_embed/cutoff_\d+_lookup_table")
        table(r".*adaptive_softmax/cutoff_\d+_weight")
        layout_map[r".*adaptive_softmax/cutoff_\d+_b"] = (model,)
        return layout_map
    bounds = cluster_bounds(config.n_token, config.cutoffs)
    for i, (low, high) in enumerate(zip(bounds[:-1], bounds[1:])):
        if divides(high - low):
            table(rf".*adaptive_embed/cutoff_{i}_lookup_table")
            table(rf".*adaptive_softmax/cutoff_{i}_weight")
            layout_map[rf".*adaptive_softmax/cutoff_{i}_b"] = (model,)
    return layout_map
