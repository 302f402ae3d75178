"""`python -m txl_keras.export`: a run folder's checkpoint -> a SavedModel.

    python -m txl_keras.export --model_dir=runs/quickstart --output=exported/quickstart
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from absl import app, flags

from tf_records import files, program
from txl_keras.export import export_saved_model
from txl_keras.run_folder import load_trained_model

FLAGS = flags.FLAGS
flags.DEFINE_string("model_dir", None, "Training folder (config.json and checkpoints).")
flags.DEFINE_string("checkpoint", None, "Checkpoint folder (default: the latest in --model_dir).")
flags.DEFINE_string("output", None, "Where to write the SavedModel (a new or empty folder).")
flags.DEFINE_integer("mem_len", None, "Memory length to serve with (default: the config's).", lower_bound=0)
flags.DEFINE_integer("clamp_len", None, "clamp_len to serve with (-1 or 0: no clamping).", lower_bound=-1)
flags.DEFINE_bool("same_length", None, "same_length to serve with.")


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
    if not FLAGS.model_dir or not FLAGS.output:
        raise app.UsageError("--model_dir and --output are required.")
    if files.listdir(FLAGS.output):
        raise app.UsageError(f"--output={FLAGS.output} is not empty; choose a new folder (nothing is overwritten).")
    model = load_trained_model(FLAGS.model_dir, FLAGS.checkpoint)
    export_saved_model(model, FLAGS.output, FLAGS.mem_len, FLAGS.clamp_len, FLAGS.same_length)
    print(f"wrote {FLAGS.output}")


if __name__ == "__main__":
    program.run(main)
