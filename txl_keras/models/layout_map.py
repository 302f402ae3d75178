"""`get_layout_map`: how `keras.distribution.ModelParallel` shards a Transformer-XL's weights.

As KerasHub's backbones publish theirs: each attention's heads (the columns of the query, key,
value and position projections, the rows of the output projection), the feed-forward's inner
dimension, and the vocabulary rows of the adaptive embedding's and softmax's clusters go across
the mesh's model axis; the layer norms, the global position biases and the small cluster
projections are replicated. A weight is sharded only where its dimension divides by the model
axis (with `config` given, each cluster is checked; without it, every sharded dimension must
divide). The memory needs no entry: its variables take the batch's layout from the data.
"""

import keras

from txl_keras.layers.adaptive_clusters import cluster_bounds


def get_layout_map(device_mesh, model_parallel_dim_name="model", data_parallel_dim_name="batch", config=None):
    """A `keras.distribution.LayoutMap` of the weights' paths (regular expressions matching
    `TransformerXL`'s and `TransformerXLLM`'s, whatever the model's name) for `device_mesh`,
    whose axes include `model_parallel_dim_name`: the attention heads, the feed-forward's inner
    dimension and the adaptive clusters' vocabulary rows are split over that axis (with
    `config`, only what divides by it). Both models' static `get_layout_map`. `data_parallel_dim_name` is accepted for
    KerasHub's signature; the data's layout is the distribution's `batch_dim_name`."""
    del data_parallel_dim_name
    if model_parallel_dim_name not in device_mesh.axis_names:
        raise ValueError(f"The device mesh has no axis {model_parallel_dim_name!r} (its axes: "
                         f"{list(device_mesh.axis_names)}); name the model-parallel axis.")
    model = model_parallel_dim_name
    shards = device_mesh.shape[list(device_mesh.axis_names).index(model)]

    def divides(n):
        return config is None or n % shards == 0

    layout_map = keras.distribution.LayoutMap(device_mesh)
    if config is None or divides(config.n_head * config.d_head):
        layout_map[r".*rel_attn/(qkv|r)_kernel"] = (None, model)
        layout_map[r".*rel_attn/o_kernel"] = (model, None)
        layout_map[r".*rel_attn/qkv_lora_b"] = (None, model)
        layout_map[r".*rel_attn/o_lora_a"] = (model, None)
    if config is None or divides(config.d_inner):
        layout_map[r".*ff/layer_1/kernel"] = (None, model)
        layout_map[r".*ff/layer_1/bias"] = (model,)
        layout_map[r".*ff/layer_2/kernel"] = (model, None)
    if config is None:
        layout_map[r".*adaptive_embed/cutoff_\d+_lookup_table"] = (model, None)
        layout_map[r".*adaptive_softmax/cutoff_\d+_weight"] = (model, None)
        layout_map[r".*adaptive_softmax/cutoff_\d+_b"] = (model,)
        return layout_map
    bounds = cluster_bounds(config.n_token, config.cutoffs)
    for i, (low, high) in enumerate(zip(bounds[:-1], bounds[1:])):
        if divides(high - low):
            layout_map[rf".*adaptive_embed/cutoff_{i}_lookup_table"] = (model, None)
            layout_map[rf".*adaptive_softmax/cutoff_{i}_weight"] = (model, None)
            layout_map[rf".*adaptive_softmax/cutoff_{i}_b"] = (model,)
    return layout_map
