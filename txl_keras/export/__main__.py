"""`python -m txl_keras.export`: a run folder's checkpoint -> a SavedModel (with its vocabulary).

    python -m txl_keras.export --model_dir=runs/quickstart --output=exported/quickstart
"""

from txl_io import startup

startup.start_program()  # first: the BFC CPU allocator, TensorFlow imported without its start-up notices

from absl import app, flags

from txl_io import files, program
from tf_records.vocabulary import VOCAB_FILE, Vocabulary
from txl_keras import export  # its names load the exporter (Keras) on first use, after --help
from txl_keras.models import sizes
from txl_keras.run_folder import load_trained_model, require_config

FLAGS = flags.FLAGS
flags.DEFINE_string("model_dir", None, "Training folder (config.json, vocab.json and checkpoints).")
flags.DEFINE_string("checkpoint", None, "Checkpoint folder (default: the newest in --model_dir).")
flags.DEFINE_string("vocab", None, "vocab.json to export with the model (default: the one in --model_dir).")
flags.DEFINE_string("output", None, "Where to write the SavedModel (a new or empty folder).")
flags.DEFINE_integer("mem_len", None, "Memory length to serve with (default: the config's).", lower_bound=0)
flags.DEFINE_integer("clamp_len", None, "clamp_len to serve with (-1 or 0: no clamping).", lower_bound=-1)
flags.DEFINE_bool("same_length", None, "same_length to serve with.")
flags.DEFINE_bool("check_memory", True, "Refuse an export whose memory (the weights, --mem_len) cannot fit this "
                  "machine's (estimated before the model is built).")


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
    if not FLAGS.model_dir or not FLAGS.output:
        raise app.UsageError("--model_dir and --output are required.")
    if files.listdir(FLAGS.output):
        raise app.UsageError(f"--output={FLAGS.output} is not empty; choose a new folder (nothing is overwritten).")
    vocab_path = FLAGS.vocab or files.join(FLAGS.model_dir, VOCAB_FILE)
    vocabulary = Vocabulary.load(vocab_path) if FLAGS.vocab or files.exists(vocab_path) else None
    if FLAGS.check_memory:
        config = require_config(FLAGS.model_dir).with_memory(FLAGS.mem_len, FLAGS.clamp_len)
        sizes.require_memory(sizes.inference_bytes(config, 1) + sizes.EXPORT_BYTES,
                             f"Exporting at mem_len={config.mem_len}")
    model = load_trained_model(FLAGS.model_dir, FLAGS.checkpoint)
    export.export_saved_model(model, FLAGS.output, vocabulary, FLAGS.mem_len, FLAGS.clamp_len, FLAGS.same_length)
    print(f"wrote {FLAGS.output}" + ("" if vocabulary else f" (no vocabulary: {vocab_path} is absent)"))


if __name__ == "__main__":
    program.run(main)
