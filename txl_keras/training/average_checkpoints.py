r"""Average the weights of the last k checkpoints (as the original `avg_checkpoints.py`).

    python -m txl_keras.training.average_checkpoints --model_dir=runs/wt103 --num_last=5 \
        --output=runs/wt103/averaged.weights.h5
"""

if __name__ == "__main__":  # the program's start, before TensorFlow is imported
    from txl_io import startup

    startup.start_program()

import contextlib  # noqa: E402

import h5py
import numpy as np
from absl import app, flags

from txl_io import files, program
from txl_keras.run_folder import READ_TRIES, list_checkpoints, weights_path


def average_weights(paths, output):
    """Write the element-wise mean of Keras weight files of one model to `output`."""
    if not paths:
        raise ValueError("No checkpoint to average.")
    with contextlib.ExitStack() as stack:
        sources = [h5py.File(stack.enter_context(files.local_input(weights_path(p))), "r") for p in paths]
        for f in sources:
            stack.callback(f.close)
        return _write_mean(sources, paths, output)


def _write_mean(sources, paths, output):
    names = []
    sources[0].visititems(lambda n, o: names.append(n) if isinstance(o, h5py.Dataset) else None)
    for f, p in zip(sources[1:], paths[1:]):
        other = []
        f.visititems(lambda n, o: other.append(n) if isinstance(o, h5py.Dataset) else None)
        if sorted(other) != sorted(names):
            raise ValueError(f"{p} holds other weights than {paths[0]}; average checkpoints of one model.")
        for name in names:
            if f[name].shape != sources[0][name].shape:
                raise ValueError(f"{p} holds {name} of shape {f[name].shape} where {paths[0]} has "
                                 f"{sources[0][name].shape}: checkpoints of two models; average those of one.")
    files.remove_leftovers(files.dirname(output) or ".", {files.basename(output)})
    with files.local_output(output, overwrite=False) as tmp:
        with h5py.File(tmp, "w") as out:
            for key, value in sources[0].attrs.items():
                out.attrs[key] = value
            sources[0].visititems(lambda n, o: _copy_group(n, o, out))
            for name in names:
                mean = np.mean([np.asarray(f[name][()], np.float64) for f in sources], axis=0)
                out[name][...] = mean.astype(sources[0][name].dtype)
    return output


def _copy_group(name, obj, out):
    if isinstance(obj, h5py.Group):
        group = out.require_group(name)
        for key, value in obj.attrs.items():
            group.attrs[key] = value
    else:
        out.create_dataset(name, data=obj[()])


FLAGS = flags.FLAGS


def define_flags():
    flags.DEFINE_string("model_dir", None, "Training folder.")
    flags.DEFINE_integer("num_last", 5, "Average the newest this many checkpoints.", lower_bound=1)
    flags.DEFINE_string("output", None, "The averaged .weights.h5 (default: in --model_dir).")


def main(argv):
    del argv
    if not FLAGS.model_dir:
        raise app.UsageError("--model_dir is required.")
    output = FLAGS.output or files.join(FLAGS.model_dir, "averaged.weights.h5")
    if files.exists(output):
        raise app.UsageError(f"{output} exists; pass another --output (nothing is overwritten).")
    if not output.endswith(".weights.h5"):
        raise app.UsageError(f"--output={output} must end with .weights.h5 (Keras reads weights files by it).")
    for attempt in range(READ_TRIES):  # a trainer may rotate a checkpoint away while it is read
        found = list_checkpoints(FLAGS.model_dir)[-FLAGS.num_last:]
        try:
            average_weights([p for _, p in found], output)
            break
        except OSError:  # h5py reports a file removed under it as a bare OSError
            rotated = not all(files.exists(weights_path(p)) for _, p in found)
            if attempt == READ_TRIES - 1 or not rotated:
                raise
    print(f"averaged steps {[s for s, _ in found]} -> {output}")


if __name__ == "__main__":
    define_flags()
    program.run(main)
