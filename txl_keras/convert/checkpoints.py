r"""Load the original Transformer-XL weights: TF checkpoints, PyTorch state dicts, and the
`cache.pkl` vocabulary (read without running pickled code).

    python -m txl_keras.convert --tf_checkpoint=pretrained/wt103/model/model.ckpt-0 \
        --cache_pkl=pretrained/wt103/data/cache.pkl --output=converted/wt103 \
        --tgt_len=128 --mem_len=1600 --clamp_len=1000 --same_length

(the program is `txl_keras/convert/__main__.py`).

The structure (layers, widths, heads, vocabulary, cutoffs, div_val, tying) is read from
the variable shapes; the memory settings come from the caller. The source's numerical
quirks are selected by config fields: TF checkpoints get `mem_init="zeros"`,
`same_length_convention="tf"`, `cluster_order="tf"`, `layer_norm_epsilon=1e-12`;
PyTorch state dicts those of the code that wrote them (told by the key names).
"""

import collections.abc
import json
import logging
import re
import types

import numpy as np

from txl_io import files
from tf_records.original import ConversionError, load_cache_vocab  # noqa: F401 (part of this module's API)

from txl_keras.models.config import TransformerXLConfig
from txl_keras.models.transformer_xl_lm import TransformerXLLM

OPTIMIZER_SUFFIXES = ("/Adam", "/Adam_1")
OPTIMIZER_NAMES = ("global_step", "beta1_power", "beta2_power")
TF_QUIRKS = dict(mem_init="zeros", same_length_convention="tf", cluster_order="tf", layer_norm_epsilon=1e-12)
PT_QUIRKS = dict(mem_init="empty", same_length_convention="pytorch", cluster_order="pytorch",
                 layer_norm_epsilon=1e-5)
HF_QUIRKS = dict(mem_init="zeros", same_length_convention="pytorch", cluster_order="tf",
                 layer_norm_epsilon=1e-5)




# -- assignment into a model, shared by both sources ------------------------------------------


def _targets(model):
    """Our variables by a canonical name (the TF name without 'transformer/')."""
    bb, soft = model.backbone, model.softmax
    out = {}
    if bb.config.attn_type == 0:
        out["r_w_bias"], out["r_r_bias"] = bb.r_w_bias, bb.r_r_bias
    emb = bb.word_emb
    for i, (table, proj) in enumerate(zip(emb.tables, emb.projections)):
        prefix = "adaptive_embed/" if emb.div_val == 1 else f"adaptive_embed/cutoff_{i}/"
        out[prefix + "lookup_table"] = table
        if proj is not None:
            out[prefix + "proj_W"] = proj
    for l, block in enumerate(bb.blocks):
        a, f = block.attention, block.feed_forward
        out.update({
            f"layer_{l}/rel_attn/qkv/kernel": a.qkv_kernel,
            f"layer_{l}/rel_attn/o/kernel": a.o_kernel,
            f"layer_{l}/rel_attn/LayerNorm/gamma": a.layer_norm.gamma,
            f"layer_{l}/rel_attn/LayerNorm/beta": a.layer_norm.beta,
            f"layer_{l}/ff/layer_1/kernel": f.layer_1.kernel,
            f"layer_{l}/ff/layer_1/bias": f.layer_1.bias,
            f"layer_{l}/ff/layer_2/kernel": f.layer_2.kernel,
            f"layer_{l}/ff/layer_2/bias": f.layer_2.bias,
            f"layer_{l}/ff/LayerNorm/gamma": f.layer_norm.gamma,
            f"layer_{l}/ff/LayerNorm/beta": f.layer_norm.beta,
        })
        if a.position_projection:
            out[f"layer_{l}/rel_attn/r/kernel"] = a.r_kernel
    if not soft.cutoffs:
        out["adaptive_softmax/bias"] = soft.biases[0]
    else:
        for i, bias in enumerate(soft.biases):
            out[f"adaptive_softmax/cutoff_{i}/b"] = bias
        out["adaptive_softmax/cutoff_0/cluster_W"] = soft.cluster_W
        out["adaptive_softmax/cutoff_0/cluster_b"] = soft.cluster_b
    for i, proj in enumerate(soft.own_projections):
        if proj is not None:
            out[f"adaptive_softmax/cutoff_{i}/proj"] = proj
    for i, table in enumerate(soft.own_tables):
        if table is not None:
            out[f"adaptive_softmax/cutoff_{i}/weight"] = table
    return out


def _assign(model, arrays, source):
    """Assign canonical-named arrays; every target must be filled, every array used."""
    targets = _targets(model)
    missing = sorted(set(targets) - set(arrays))
    unused = sorted(set(arrays) - set(targets))
    if missing or unused:
        raise ConversionError(
            f"{source} does not match the config: missing {missing[:10]}{'...' if len(missing) > 10 else ''}; "
            f"not used {unused[:10]}{'...' if len(unused) > 10 else ''}. Check the config fields "
            "(div_val, proj_share_all_but_first, proj_same_dim, untie_r, cutoffs, d_embed)."
        )
    for name, variable in targets.items():
        value = np.asarray(arrays[name])  # (read here: one array at a time)
        if tuple(value.shape) != tuple(variable.shape):
            raise ConversionError(
                f"{source}: {name} has shape {tuple(value.shape)} but the config needs "
                f"{tuple(variable.shape)}; the checkpoint was trained with another config."
            )
        variable.assign(value.astype(variable.dtype, copy=False))


# -- structure from shapes ---------------------------------------------------------------------


def _infer_config(arrays, overrides):
    """The config of converted weights, read from the variable shapes."""
    try:
        return _config_from_shapes(arrays, overrides)
    except (KeyError, IndexError) as e:
        raise ConversionError(f"The weights are not a complete Transformer-XL checkpoint: {e} is missing or "
                              "has another shape than the original code writes.") from None


def _config_from_shapes(arrays, overrides):
    layers = sorted({int(m.group(1)) for n in arrays if (m := re.match(r"layer_(\d+)/", n))})
    if not layers:
        raise ConversionError("No layer_*/ variables found; is this a Transformer-XL checkpoint?")
    if "r_w_bias" not in arrays:
        raise ConversionError("No r_w_bias: only attn_type 0 checkpoints can be converted.")
    bias = arrays["r_w_bias"].shape
    if len(bias) not in (2, 3):
        raise ConversionError(f"r_w_bias has shape {tuple(bias)}, where the original code writes (n_head, d_head) "
                              "or (n_layer, n_head, d_head).")
    d_model = arrays["layer_0/rel_attn/qkv/kernel"].shape[0]
    n_head, d_head = bias[-2], bias[-1]
    if "adaptive_embed/lookup_table" in arrays:
        div_val = 1
        n_token, d_embed = arrays["adaptive_embed/lookup_table"].shape
        sizes = [arrays[f"adaptive_softmax/cutoff_{i}/b"].shape[0]
                 for i in range(64) if f"adaptive_softmax/cutoff_{i}/b" in arrays]
    else:
        tables = [arrays[f"adaptive_embed/cutoff_{i}/lookup_table"].shape
                  for i in range(64) if f"adaptive_embed/cutoff_{i}/lookup_table" in arrays]
        sizes = [t[0] for t in tables]
        n_token, d_embed = sum(sizes), tables[0][1]
        div_val = tables[0][1] // tables[1][1] if len(tables) > 1 else 1
    cutoffs = list(np.cumsum(sizes)[:-1]) if len(sizes) > 1 else []
    n_clusters = len(cutoffs) + 1
    own_proj = [f"adaptive_softmax/cutoff_{i}/proj" in arrays for i in range(n_clusters)]
    structure = dict(
        n_token=int(n_token), n_layer=len(layers), d_model=int(d_model), d_embed=int(d_embed),
        n_head=int(n_head), d_head=int(d_head),
        d_inner=int(arrays["layer_0/ff/layer_1/kernel"].shape[1]),
        cutoffs=[int(c) for c in cutoffs], div_val=int(div_val), untie_r=len(bias) == 3,
        proj_same_dim=not (div_val > 1 and "adaptive_embed/cutoff_0/proj_W" not in arrays and d_embed == d_model),
        tie_projs=[not p for p in own_proj] if cutoffs else None,
        dropout=0.0, dropatt=0.0,
    )
    # A softmax projection missing from the checkpoint is tied (or not needed, where
    # the embedding has none either): both read as "use the embedding's".
    return TransformerXLConfig.from_dict({**structure, **overrides})


# -- TensorFlow checkpoints ----------------------------------------------------------------------


class CheckpointArrays(collections.abc.Mapping):
    """`{canonical name: array}` of a TF checkpoint, each array read when it is asked for
    (converting the largest released model then takes about its size once, in the model)."""

    def __init__(self, reader, names):
        self._reader, self._names = reader, names  # canonical name -> name in the checkpoint
        shapes = reader.get_variable_to_shape_map()
        self.shapes = {k: types.SimpleNamespace(shape=tuple(shapes[v])) for k, v in names.items()}

    def __getitem__(self, name):
        return self._reader.get_tensor(self._names[name])

    def __iter__(self):
        return iter(self._names)

    def __len__(self):
        return len(self._names)


def read_tf_checkpoint(path):
    """The arrays of a TF checkpoint (`CheckpointArrays`, optimizer slots dropped) and the
    list of names dropped."""
    import tensorflow as tf

    try:
        reader = tf.train.load_checkpoint(path)
    except Exception as e:  # NotFoundError, DataLossError
        raise ConversionError(f"Cannot read a TF checkpoint at {path}: {str(e).splitlines()[0]}") from None
    names, dropped = {}, []
    for name in reader.get_variable_to_shape_map():
        if name.endswith(OPTIMIZER_SUFFIXES) or name in OPTIMIZER_NAMES:
            dropped.append(name)
            continue
        if not name.startswith("transformer/"):
            raise ConversionError(f"Unexpected variable {name!r} in {path}: not under transformer/.")
        names[name[len("transformer/"):]] = name
    return CheckpointArrays(reader, names), dropped


def from_tf_checkpoint(path, config=None, **overrides):
    """A TransformerXLLM holding the weights of an original TF checkpoint.

    `config` (a TransformerXLConfig) fixes everything; otherwise the structure is read
    from the shapes and `overrides` set the rest (tgt_len, mem_len, clamp_len,
    same_length...). The TF code's quirks are selected unless overridden.
    """
    arrays, dropped = read_tf_checkpoint(path)
    if dropped:
        logging.getLogger(__name__).info("%s: dropped %d optimizer variables (%s ...)", path, len(dropped), dropped[0])
    if config is None:
        config = _infer_config(arrays.shapes, {**TF_QUIRKS, **overrides})
    model = TransformerXLLM(config)
    _assign(model, arrays, f"TF checkpoint {path}")
    return model


# -- PyTorch state dicts ---------------------------------------------------------------------------


def _numpy(value):
    if hasattr(value, "detach"):
        value = value.detach().cpu().numpy()
    return np.asarray(value)


def pytorch_to_canonical(state_dict):
    """Rename (and transpose) a PyTorch MemTransformerLM / HF `transfo-xl` state dict."""
    _check_state_dict(state_dict)
    try:
        return _canonical_names(state_dict)
    except KeyError as e:
        raise ConversionError(f"The state dict is not a complete Transformer-XL one: {e} is missing.") from None


def _check_state_dict(state_dict):
    if not hasattr(state_dict, "items") or not state_dict or not all(isinstance(k, str) for k in state_dict):
        raise ConversionError("The state dict is empty or not a mapping of names to tensors; pass the "
                              "state_dict() of a Transformer-XL model.")


def _canonical_names(state_dict):
    sd = {k[len("transformer."):] if k.startswith("transformer.") else k: _numpy(v)
          for k, v in state_dict.items()}
    out = {}
    emb_layers = sorted(int(m.group(1)) for k in sd if (m := re.match(r"word_emb\.emb_layers\.(\d+)\.weight$", k)))
    div1 = len(emb_layers) == 1 and not any(k.startswith("crit.out_layers.1") for k in sd)
    for i in emb_layers:
        prefix = "adaptive_embed/" if div1 else f"adaptive_embed/cutoff_{i}/"
        out[prefix + "lookup_table"] = sd.pop(f"word_emb.emb_layers.{i}.weight")
        if f"word_emb.emb_projs.{i}" in sd:
            out[prefix + "proj_W"] = sd.pop(f"word_emb.emb_projs.{i}").T
    sd.pop("pos_emb.inv_freq", None)
    layers = sorted({int(m.group(1)) for k in sd if (m := re.match(r"layers\.(\d+)\.", k))})
    per_layer_bias = f"layers.{layers[0]}.dec_attn.r_w_bias" in sd if layers else False
    if per_layer_bias:  # HF untie_r: one pair per layer
        out["r_w_bias"] = np.stack([sd.pop(f"layers.{l}.dec_attn.r_w_bias") for l in layers])
        out["r_r_bias"] = np.stack([sd.pop(f"layers.{l}.dec_attn.r_r_bias") for l in layers])
    else:
        out["r_w_bias"], out["r_r_bias"] = sd.pop("r_w_bias"), sd.pop("r_r_bias")
    names = {
        "dec_attn.qkv_net.weight": "rel_attn/qkv/kernel", "dec_attn.r_net.weight": "rel_attn/r/kernel",
        "dec_attn.o_net.weight": "rel_attn/o/kernel", "dec_attn.layer_norm.weight": "rel_attn/LayerNorm/gamma",
        "dec_attn.layer_norm.bias": "rel_attn/LayerNorm/beta", "pos_ff.CoreNet.0.weight": "ff/layer_1/kernel",
        "pos_ff.CoreNet.0.bias": "ff/layer_1/bias", "pos_ff.CoreNet.3.weight": "ff/layer_2/kernel",
        "pos_ff.CoreNet.3.bias": "ff/layer_2/bias", "pos_ff.layer_norm.weight": "ff/LayerNorm/gamma",
        "pos_ff.layer_norm.bias": "ff/LayerNorm/beta",
    }
    for l in layers:
        for source, target in names.items():
            value = sd.pop(f"layers.{l}.{source}")
            linear = source.endswith("net.weight") or (source.startswith("pos_ff.CoreNet") and source.endswith(".weight"))
            out[f"layer_{l}/{target}"] = value.T if linear else value  # PyTorch Linear is [out, in]
    clusters = sorted(int(m.group(1)) for k in sd if (m := re.match(r"crit\.out_layers\.(\d+)\.bias$", k)))
    if len(clusters) == 1:  # one output layer: a plain softmax, or div_val 1 (split later)
        out["adaptive_softmax/bias"] = sd.pop("crit.out_layers.0.bias")
    else:
        for i in clusters:
            out[f"adaptive_softmax/cutoff_{i}/b"] = sd.pop(f"crit.out_layers.{i}.bias")
    if "crit.cluster_weight" in sd:
        out["adaptive_softmax/cutoff_0/cluster_W"] = sd.pop("crit.cluster_weight")
        out["adaptive_softmax/cutoff_0/cluster_b"] = sd.pop("crit.cluster_bias")
    for k in [k for k in sd if re.match(r"crit\.out_layers\.\d+\.weight$", k)]:
        sd.pop(k)  # tied to the embedding tables
    for k in [k for k in sd if re.match(r"crit\.out_projs\.\d+$", k)]:
        i = int(k.rsplit(".", 1)[1])
        value = sd.pop(k)
        emb = out.get("adaptive_embed/proj_W" if div1 else f"adaptive_embed/cutoff_{i}/proj_W")
        if emb is None or not np.array_equal(value.T, emb):
            out[f"adaptive_softmax/cutoff_{i}/proj"] = value.T
    return out, sd


def pytorch_source(state_dict):
    """Which code wrote a PyTorch state dict, told by its key names: "huggingface" (the
    `transfo-xl` port keeps the backbone under `transformer.`) or "original"."""
    return "huggingface" if any(k.startswith("transformer.") for k in state_dict) else "original"


SOURCE_QUIRKS = {"original": PT_QUIRKS, "huggingface": HF_QUIRKS}


def from_pytorch_state_dict(state_dict, config, strict=True, **quirks):
    """A TransformerXLLM holding a PyTorch state dict (original or HF `transfo-xl` names).

    `config` gives the structure (layers, widths, vocabulary, cutoffs, memory settings).
    The numerical behaviour of the code that wrote the weights is selected from the key
    names, as `from_tf_checkpoint` does for TF: the original PyTorch code gets PT_QUIRKS
    (empty first memory, its same_length mask, its cluster order), HF's port HF_QUIRKS
    (zero-filled memory, TF cluster order). They replace the config's four quirk fields;
    pass `mem_init=`, `same_length_convention=`, `cluster_order=` or `layer_norm_epsilon=`
    to override one explicitly. Keys left over are an error with `strict`.
    """
    _check_state_dict(state_dict)
    unknown = sorted(set(quirks) - set(PT_QUIRKS))
    if unknown:
        raise ConversionError(f"Unknown quirk overrides {unknown}; expected some of {sorted(PT_QUIRKS)}.")
    source = pytorch_source(state_dict)
    config = config.replace(**{**SOURCE_QUIRKS[source], **quirks})
    logging.getLogger(__name__).info("PyTorch state dict of the %s code: %s", source,
                                     {k: getattr(config, k) for k in PT_QUIRKS})
    arrays, left = pytorch_to_canonical(state_dict)
    if left and strict:
        raise ConversionError(f"State dict keys not converted: {sorted(left)[:20]}")
    if config.cutoffs and "adaptive_softmax/bias" in arrays:  # div_val 1: split per cluster
        bias = arrays.pop("adaptive_softmax/bias")
        bounds = [0] + config.cutoffs + [config.n_token]
        for i in range(len(bounds) - 1):
            arrays[f"adaptive_softmax/cutoff_{i}/b"] = bias[bounds[i]:bounds[i + 1]]
    model = TransformerXLLM(config)
    _assign(model, arrays, "PyTorch state dict")
    return model


# -- the converted run folder -------------------------------------------------------------------------


def write_converted(output, model, vocab=None, dataset=None):
    """Write converted weights as a run folder: config.json, the checkpoint, and with a
    vocabulary vocab.json and corpus-info.json. Written whole (`files.staged_folder`): a
    second conversion into `output` is refused, an interrupted one completed."""
    from tf_records.build import CORPUS_INFO_FILE
    from tf_records.vocabulary import VOCAB_FILE
    from txl_keras.run_folder import CONFIG, INDEX, save_checkpoint

    config = model.config
    if vocab is not None and len(vocab) != config.n_token:
        raise ConversionError(f"The vocabulary has {len(vocab)} symbols but the weights have n_token="
                              f"{config.n_token}: they belong to another model (check the cache.pkl).")
    with files.staged_folder(output, "a conversion", last=INDEX) as staging:
        files.atomic_write(files.join(staging, CONFIG), config.to_json())
        if vocab is not None:
            vocab.save(files.join(staging, VOCAB_FILE))
            info = {"dataset": dataset, "vocab_size": len(vocab), "cutoffs": [0] + config.cutoffs + [config.n_token]}
            files.atomic_write(files.join(staging, CORPUS_INFO_FILE), json.dumps(info, indent=2))
        save_checkpoint(staging, 0, model, None)
    return output
