"""Peak memory of converting an original TF checkpoint, against the checkpoint's size.

    python bench/convert_memory.py --layers=4 --vocab=200000

Writes a checkpoint of the One Billion Word large architecture (`lm1b_large`: d_model 1280,
16 heads of 80, d_inner 8192, div_val 4, its cutoffs) with `--layers` layers and a
vocabulary of `--vocab` words (the release has 24 layers and 793,470 words: 0.8 B
parameters, 3.3 GB), in the variable names and shapes of the original code (with Adam's
two moments per weight, as the released training checkpoints hold them; the conversion
drops them), then converts it in a fresh process
(`from_tf_checkpoint` and the converted run folder, as `python -m txl_keras.convert` and
`from_preset` do) and prints the conversion's peak RSS above the process's RSS after
importing TensorFlow, next to the checkpoint's size and the size of the model's weights.
"""

import argparse
import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))
from common import current_rss_mb, emit, peak_rss_mb, run_worker  # noqa: E402


def arrays_of(config):
    """The original's variables (tf/model.py names) of a config, as random float32 arrays."""
    import numpy as np

    from original_formats import tf_arrays
    import original_formats

    # tf_arrays builds the layers from the module's sizes: set them to this config's
    original_formats.L, original_formats.D, original_formats.H = config.n_layer, config.d_model, config.n_head
    original_formats.DH, original_formats.DI = config.d_head, config.d_inner
    arrays, _ = tf_arrays(np.random.default_rng(0), config.n_token, config.cutoffs, config.div_val, config.d_embed,
                          config.untie_r, config.proj_share_all_but_first, config.proj_same_dim)
    return arrays


def write_worker(args):
    import numpy as np
    import tensorflow as tf

    from txl_keras.models.config import TransformerXLConfig

    vocab = args.vocab
    cutoffs = [c for c in (60000, 100000, 640000) if c < vocab][:3]
    config = TransformerXLConfig.from_preset("lm1b_large", n_layer=args.layers, n_token=vocab, cutoffs=cutoffs)
    arrays = arrays_of(config)
    weights_mb = sum(a.nbytes for a in arrays.values()) / 1e6
    for name in list(arrays):  # Adam's two moments, which a training checkpoint holds (the conversion drops them)
        arrays[name + "/Adam"] = arrays[name + "/Adam_1"] = np.zeros_like(arrays[name])
    names = sorted(arrays)  # (SaveV2 writes the original's names; a graph of constants would pass 2 GB)
    tf.raw_ops.SaveV2(prefix=os.path.join(args.folder, "model.ckpt-0"), tensor_names=names,
                      shape_and_slices=[""] * len(names), tensors=[arrays[n] for n in names])
    return {"weights_mb": weights_mb}


def convert_worker(args):
    import tensorflow as tf  # noqa: F401 (the framework's own memory is not the conversion's)

    imported = current_rss_mb()
    from txl_keras.convert import from_tf_checkpoint, write_converted

    model = from_tf_checkpoint(os.path.join(args.folder, "model.ckpt-0"), tgt_len=32, mem_len=128)
    write_converted(os.path.join(args.folder, "converted"), model)
    return {"peak_above_import_mb": peak_rss_mb() - imported, "parameters": model.count_params()}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=200000)
    parser.add_argument("--impl", choices=["write", "convert"], help="run one worker (internal)")
    parser.add_argument("--folder", help="(internal)")
    args = parser.parse_args()
    if args.impl:
        return emit((write_worker if args.impl == "write" else convert_worker)(args))
    with tempfile.TemporaryDirectory() as folder:
        common = ["--layers", str(args.layers), "--vocab", str(args.vocab), "--folder", folder]
        written = run_worker(sys.executable, __file__, common + ["--impl", "write"])
        size = sum(os.path.getsize(os.path.join(folder, n)) for n in os.listdir(folder)) / 1e6
        converted = run_worker(sys.executable, __file__, common + ["--impl", "convert"])
    print(f"command: python bench/{os.path.basename(__file__)} " + " ".join(sys.argv[1:]))
    print(json.dumps({"layers": args.layers, "vocab": args.vocab, **written, **converted,
                      "checkpoint_files_mb": size}))
    print(f"lm1b_large architecture, {args.layers} layers, {args.vocab:,} words: {converted['parameters']:,} "
          f"parameters, {written['weights_mb']:,.0f} MB of weights, {size:,.0f} MB of checkpoint files; conversion peak "
          f"{converted['peak_above_import_mb']:,.0f} MB above the import: {converted['peak_above_import_mb'] / size:.2f}x "
          f"the checkpoint, {converted['peak_above_import_mb'] / written['weights_mb']:.2f}x the weights")


if __name__ == "__main__":
    main()
