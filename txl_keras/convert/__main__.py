r"""`python -m txl_keras.convert`: original weights -> a run folder txl_keras can evaluate,
export and generate from (config.json, vocab.json, corpus-info.json, ckpt-00000000/).

    python -m txl_keras.convert --tf_checkpoint=pretrained/wt103/model/model.ckpt-0 \
        --cache_pkl=pretrained/wt103/data/cache.pkl --output=converted/wt103 \
        --tgt_len=128 --mem_len=1600 --clamp_len=1000 --same_length

The folder is written whole (staged beside it, then renamed): an interrupted conversion
leaves no partial folder, and the same command completes it.
"""

from txl_io import startup

startup.start_program()  # first: the BFC CPU allocator, TensorFlow imported without its start-up notices

from absl import app, flags

from txl_io import files, program
from txl_keras import convert  # its names load the converter (Keras) on first use, after --help
from txl_keras.models.config import TransformerXLConfig

FLAGS = flags.FLAGS
flags.DEFINE_string("tf_checkpoint", None, "Original TF checkpoint prefix (model.ckpt-0).")
flags.DEFINE_string("pytorch_state_dict", None, "A torch.save'd state dict (needs torch).")
flags.DEFINE_string("config_json", None, "TransformerXLConfig JSON (required for PyTorch).")
flags.DEFINE_string("cache_pkl", None, "The original cache.pkl, to save its vocabulary.")
flags.DEFINE_string("output", None, "A new or empty folder for config.json, vocab.json and a checkpoint.")
flags.DEFINE_integer("tgt_len", 128, "Segment length to evaluate with.", lower_bound=1)
flags.DEFINE_integer("mem_len", 1600, "Memory length to evaluate with.", lower_bound=0)
flags.DEFINE_integer("clamp_len", 1000, "clamp_len to evaluate with (-1 or 0: no clamping).", lower_bound=-1)
flags.DEFINE_bool("same_length", True, "same_length to evaluate with.")


def convert_model():
    memory = dict(tgt_len=FLAGS.tgt_len, mem_len=FLAGS.mem_len, clamp_len=FLAGS.clamp_len,
                  same_length=FLAGS.same_length)
    if FLAGS.tf_checkpoint:
        return convert.from_tf_checkpoint(FLAGS.tf_checkpoint, **memory)
    if not FLAGS.config_json:
        raise app.UsageError("--config_json is required with --pytorch_state_dict.")
    try:
        import torch
    except ImportError:
        raise convert.ConversionError("--pytorch_state_dict needs PyTorch (pip install torch).") from None
    config = TransformerXLConfig.from_json(files.read_text(FLAGS.config_json)).replace(**memory)
    with files.local_input(FLAGS.pytorch_state_dict) as local:
        try:
            state_dict = torch.load(local, map_location="cpu", weights_only=True)
        except Exception as e:  # torch raises several kinds for a file that is not a state dict
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise convert.ConversionError(f"Cannot read a state dict at {FLAGS.pytorch_state_dict}: {first[:200]}") from None
    return convert.from_pytorch_state_dict(state_dict, config)


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
    if not FLAGS.output or not (FLAGS.tf_checkpoint or FLAGS.pytorch_state_dict):
        raise app.UsageError("--output and one of --tf_checkpoint / --pytorch_state_dict are required.")
    if FLAGS.tf_checkpoint and FLAGS.pytorch_state_dict:
        raise app.UsageError("--tf_checkpoint and --pytorch_state_dict both name the weights to convert; give one "
                             "(one source at a time).")
    if files.listdir(FLAGS.output):
        raise app.UsageError(f"--output={FLAGS.output} is not empty (it may hold a training run); "
                             "convert into a new folder, nothing is overwritten.")
    vocab = convert.load_cache_vocab(FLAGS.cache_pkl) if FLAGS.cache_pkl else None
    model = convert_model()
    convert.write_converted(FLAGS.output, model, *(vocab or (None, None)))
    print(f"wrote {FLAGS.output} ({model.count_params():,} parameters)")


if __name__ == "__main__":
    program.run(main)
