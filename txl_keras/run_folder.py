"""A run folder: what training writes, and what evaluation, export, generation and
conversion read. Any `tf.io.gfile` path (local, gs://, ...).

    model_dir/
      config.json          the model's TransformerXLConfig: the folder's identity
      vocab.json           the vocabulary the records were encoded with
      init_from.json       with --init_from: the model the run started from
      checkpoint.json      the index of complete checkpoints, oldest first (the commit marker)
      ckpt-00001000/       model.weights.h5 (Keras weights) + state.npz (optimizer, step,
                           randomness, every replica's memory; absent in converted weights)
      best.json            with --eval_steps: the step and validation results of the best
      best-00000800.weights.h5   weights so far (by validation loss), the file it names
      train/  eval/        TensorBoard summaries
      eval_results.json
      txl_keras.lock       the lock of the one process that writes the folder

A checkpoint counts only once the index names it, and the index is rewritten (atomically)
after the checkpoint's files are complete: a crash at any moment leaves the previous
checkpoint as the latest. Locally the checkpoint folder is also written under a temporary
name and renamed into place whole.

What a file says is data: a name read from `checkpoint.json` or `best.json` is used only
if it has the exact form this module writes (`CHECKPOINT`, `BEST_WEIGHTS`), and only
files this module wrote are deleted, by name, never a folder tree.
"""

import io
import json
import math
import re
import sys

import numpy as np

from txl_io import files
from txl_keras.models.config import TransformerXLConfig

CONFIG = "config.json"
ORIGIN = "init_from.json"
INDEX = "checkpoint.json"
WEIGHTS = "model.weights.h5"
STATE = "state.npz"
BEST = "best.json"
EVALUATED = "evaluated.json"  # the last step whose evaluation (--eval_steps) was recorded
CHECKPOINT = re.compile(r"^ckpt-(\d{8,})$")
BEST_WEIGHTS = re.compile(r"^best-(\d{8,})\.weights\.h5$")
# The files of a run folder whose interrupted writes leave temporaries (`files.TEMPORARY`).
WRITTEN = re.compile(r"^(ckpt-\d{8,}|best-\d{8,}\.weights\.h5|config\.json|vocab\.json|checkpoint\.json|best\.json|"
                     r"eval_results\.json|corpus-info\.json|init_from\.json|evaluated\.json)$")


class RunFolderError(ValueError):
    """A run folder that is missing, damaged or holds another model."""


def warn(message):
    """A warning line on stderr (every worker's: each owns its folder)."""
    print(f"warning: {message}", file=sys.stderr, flush=True)


def checkpoint_name(step):
    return f"ckpt-{int(step):08d}"


def lock(model_dir):
    """The run folder's one-writer lock (`files.exclusive`)."""
    return files.exclusive(model_dir, f"The run folder {model_dir}")


# -- the folder's identity ----------------------------------------------------------------------


def _read(model_dir, name, parse, fix):
    """`parse(text)` of a file of the run folder, or None when it is absent; a damaged
    file is a RunFolderError naming it and `fix`."""
    path = files.join(model_dir, name)
    if not files.exists(path):
        return None
    try:
        return parse(files.read_text(path))
    except (ValueError, TypeError) as e:
        raise RunFolderError(f"{path} is damaged or not a txl_keras {name} ({e}); {fix}.") from None


def read_config(model_dir):
    """The TransformerXLConfig of a run folder, or None when it has no config.json."""
    return _read(model_dir, CONFIG, TransformerXLConfig.from_json,
                 "restore it, or use another --model_dir")


def require_config(model_dir):
    """The TransformerXLConfig of an existing run folder, or a RunFolderError saying what to pass."""
    what = ("pass the --model_dir of a training run (train_gpu.py) or of converted weights "
            "(python -m txl_keras.convert)")
    if not files.isdir(model_dir):
        raise RunFolderError(f"No run folder at {model_dir}; {what}.")
    config = read_config(model_dir)
    if config is None:
        raise RunFolderError(f"No {CONFIG} in {model_dir}; {what}.")
    return config


def config_differences(old, new):
    """`["field: old in ..., new requested"]` for every field where two configs differ."""
    a, b = old.to_dict(), new.to_dict()
    return [f"{k}: {a[k]!r} -> {b[k]!r}" for k in sorted(a) if a[k] != b[k]]


def check_claim(model_dir, config):
    """Whether `model_dir` may become the folder of `config` (it has no config.json, or
    the same one); else a RunFolderError saying what to do. Writes nothing."""
    old = read_config(model_dir)
    if old is None:
        return True
    changed = config_differences(old, config)
    if not changed:
        return True
    path = files.join(model_dir, CONFIG)
    if not list_checkpoints(model_dir) and read_best(model_dir) is None:
        raise RunFolderError(
            f"{path} holds another model ({'; '.join(changed[:6])}) but nothing was trained with it (no "
            "checkpoint): delete it to start this run there, or use another --model_dir.")
    raise RunFolderError(
        f"{path} holds another model ({'; '.join(changed[:6])}); use another --model_dir, or the folder's "
        f"own settings (--config={path})."
    )


def claim(model_dir, config):
    """Make `model_dir` the folder of `config`: write config.json if it has none, accept
    an identical one, refuse (writing nothing) one of another model (`check_claim`)."""
    check_claim(model_dir, config)
    if read_config(model_dir) is None:
        files.makedirs(model_dir)
        files.atomic_write(files.join(model_dir, CONFIG), config.to_json())


# -- checkpoints ----------------------------------------------------------------------------------


def _complete(path):
    return files.exists(files.join(path, WEIGHTS))


def _listed(model_dir):
    return [n for n in files.listdir(model_dir) if CHECKPOINT.match(n)]


def checkpoint_names(model_dir):
    """The names of the run folder's checkpoints: those its index lists (each of the
    form `ckpt-NNNNNNNN`), or, without an index, the checkpoint folders on disk. A damaged
    index (not JSON, not a list of names, or naming a folder that is not there) is
    rebuilt from the folders on disk, with a warning naming it."""
    path = files.join(model_dir, INDEX)
    if not files.exists(path):
        return _listed(model_dir)
    try:
        names = json.loads(files.read_text(path))["checkpoints"]
        if not isinstance(names, list) or not all(isinstance(n, str) and CHECKPOINT.match(n) for n in names):
            raise ValueError("not a list of checkpoint names")
        missing = [n for n in names if not _complete(files.join(model_dir, n))]
        if missing:
            raise ValueError(f"it names {missing[0]}, which holds no complete checkpoint")
    except (ValueError, KeyError, TypeError, files.StorageError) as e:
        found = _listed(model_dir)
        warn(f"the checkpoint index {path} is damaged ({e}); the checkpoints on disk are used instead "
             f"({', '.join(sorted(found)) or 'none'}), and the next save rewrites it.")
        return found
    return names


def list_checkpoints(model_dir):
    """`[(step, path)]` of the complete checkpoints, oldest first."""
    found = []
    for name in checkpoint_names(model_dir):
        path = files.join(model_dir, name)
        if _complete(path):
            found.append((int(CHECKPOINT.match(name).group(1)), path))
    return sorted(found)


def latest_checkpoint(model_dir):
    checkpoints = list_checkpoints(model_dir)
    return checkpoints[-1] if checkpoints else (None, None)


def _state_bytes(state):
    buffer = io.BytesIO()
    np.savez(buffer, **state)
    return buffer.getvalue()


def _write_checkpoint_files(folder, model, state):
    save_weights(model, files.join(folder, WEIGHTS))
    if state is not None:
        files.atomic_write(files.join(folder, STATE), _state_bytes(state))


def checkpoint_bytes(model, state):
    """About how many bytes a checkpoint takes (weights and state), to check the space first."""
    weights = sum(int(np.prod(v.shape)) * np.dtype(v.dtype).itemsize for v in model.weights)
    extra = sum(np.asarray(a).nbytes for a in (state or {}).values())
    return int(1.1 * (weights + extra)) + (1 << 20)


def save_checkpoint(model_dir, step, model, state, keep=5):
    """Write checkpoint `step` (model weights + the numpy arrays of `state`, which may be
    None), then keep only the newest `keep` (>= 1). Returns its path."""
    if not isinstance(keep, int) or keep < 1:
        raise ValueError(f"Expected `keep` to be a positive integer. Received: keep={keep!r}")
    files.makedirs(model_dir)
    files.check_free_space(model_dir, checkpoint_bytes(model, state), f"checkpoint {step}")
    final = files.join(model_dir, checkpoint_name(step))
    if files.is_local(model_dir):
        staging = files.join(model_dir, f"{checkpoint_name(step)}.{files.random_tag()}.partial")
        files.makedirs(staging)
        try:
            _write_checkpoint_files(staging, model, state)
            files.fsync_dir(staging)
            if files.exists(final):  # a damaged checkpoint of this step (set aside before, or ours)
                files.remove_folder(final, (WEIGHTS, STATE), files.TEMPORARY_CONTENT)
            files.rename(staging, final)
            files.fsync_dir(model_dir)
        finally:
            if files.exists(staging):
                files.remove_folder(staging, (WEIGHTS, STATE), files.TEMPORARY_CONTENT)
    else:  # object stores: no atomic folder rename; the index below is the commit
        _write_checkpoint_files(final, model, state)
    kept = [p for _, p in list_checkpoints(model_dir) if p != final][-(keep - 1):] if keep > 1 else []
    names = [files.basename(p) for p in kept] + [files.basename(final)]
    files.atomic_write(files.join(model_dir, INDEX), json.dumps({"checkpoints": names}, indent=2))
    for name in _listed(model_dir):
        if name not in names and not files.remove_folder(files.join(model_dir, name), (WEIGHTS, STATE),
                                                         files.TEMPORARY_CONTENT):
            warn(f"{files.join(model_dir, name)} holds files other than a checkpoint's; it is left in place.")
    files.remove_leftovers(model_dir, WRITTEN)
    return final


# -- the best weights -----------------------------------------------------------------------------


def _best_record(text):
    record = json.loads(text)
    if not isinstance(record, dict):
        raise ValueError("not a JSON object")
    step, loss, weights = record.get("step"), record.get("loss"), record.get("weights")
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise ValueError(f"step {step!r} is not a step")
    if isinstance(loss, bool) or not isinstance(loss, (int, float)) or not math.isfinite(loss):
        raise ValueError(f"loss {loss!r} is not a finite number")
    if not isinstance(weights, str) or not BEST_WEIGHTS.match(weights):
        raise ValueError(f"weights {weights!r} is not a best-NNNNNNNN.weights.h5 name")
    return record


def read_best(model_dir):
    """The record of the best weights so far (`{"step", "loss", ..., "weights"}`), or None.
    A damaged record is set aside (`best.json.damaged`, with a warning) and None returned:
    a new record starts; the weights files stay."""
    path = files.join(model_dir, BEST)
    if not files.exists(path):
        return None
    try:
        return _best_record(files.read_text(path))
    except (ValueError, files.StorageError) as e:
        aside = set_aside(path)
        warn(f"{path} is damaged ({e}); it is kept as {aside} and a new record of the best weights starts.")
        return None


def save_best(model_dir, model, step, results):
    """Keep `model`'s weights as the best so far: the weights file first, then best.json
    naming it (the commit), then the file it replaces is removed. Returns its path."""
    name = f"best-{int(step):08d}.weights.h5"
    previous = read_best(model_dir)
    files.check_free_space(model_dir, checkpoint_bytes(model, None), "the best weights")
    save_weights(model, files.join(model_dir, name))
    files.atomic_write(files.join(model_dir, BEST), json.dumps({"step": int(step), **results, "weights": name},
                                                               indent=2))
    if previous and previous["weights"] != name:  # (a name of the form we write: checked by read_best)
        files.remove_file(files.join(model_dir, previous["weights"]))
    return files.join(model_dir, name)


def record_evaluated(model_dir, step):
    """Record that the evaluation due at `step` is done (its best weights kept if they were)."""
    files.atomic_write(files.join(model_dir, EVALUATED), json.dumps({"step": int(step)}))


def evaluated_step(model_dir):
    """The last step whose evaluation was recorded, or None (none yet, or a damaged record)."""
    path = files.join(model_dir, EVALUATED)
    try:
        step = json.loads(files.read_text(path))["step"] if files.exists(path) else None
    except (ValueError, KeyError, TypeError, files.StorageError):
        return None
    return step if isinstance(step, int) else None


def set_aside(path):
    """Rename a damaged file or checkpoint folder to `<name>.damaged[-N]` (kept for
    inspection, out of the way). Returns the new path."""
    target, n = f"{path}.damaged", 1
    while files.exists(target):
        n += 1
        target = f"{path}.damaged-{n}"
    files.rename(path, target)
    return target


# -- weights and state --------------------------------------------------------------------------


def load_state(path):
    """The numpy arrays saved beside the weights of a checkpoint folder."""
    state_path = files.join(path, STATE)
    try:
        with np.load(io.BytesIO(files.read_bytes(state_path))) as data:
            return {k: data[k] for k in data.files}
    except (ValueError, OSError, EOFError) as e:
        if isinstance(e, FileNotFoundError):
            raise RunFolderError(f"{state_path} is missing: {path} holds weights only (converted or "
                                 "averaged); start from it with --warm_start_path.") from None
        raise RunFolderError(f"{state_path} is damaged ({e}); delete {path} to resume from the "
                             "checkpoint before it.") from None


def weights_path(path):
    """The Keras weights file of a checkpoint folder (or a weights file itself)."""
    return path if path.endswith(".weights.h5") else files.join(path, WEIGHTS)


def save_weights(model, path):
    """`model.save_weights` to any filesystem, atomically, through a temporary file beside
    `path` (Keras wants the `.weights.h5` suffix: the temporary keeps it)."""
    with files.local_output(path, suffix=".weights.h5") as local:
        model.save_weights(local)


def load_weights(model, path):
    """Load the weights of a checkpoint folder or a `.weights.h5` into `model`."""
    source = weights_path(path)
    if not files.exists(source):
        raise RunFolderError(f"No weights at {source}; expected a checkpoint folder (ckpt-NNNNNNNN) "
                             "or a .weights.h5 file.")
    with files.local_input(source) as local:
        try:
            model.load_weights(local)
        except (OSError, ValueError, KeyError) as e:
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise RunFolderError(f"Cannot load the weights {source}: {first[:300]} (a damaged file, or "
                                 "weights of another model config).") from None


# -- a trained model ------------------------------------------------------------------------------

READ_TRIES = 3  # a reader retries the newest checkpoint this often while a trainer rotates them


def load_trained_model(model_dir, checkpoint=None, **model_kwargs):
    """A TransformerXLLM from a run folder (`config.json` + a checkpoint, default the
    newest complete one; if a trainer rotates it away while it is read, the newest again)."""
    config = require_config(model_dir)
    from txl_keras.models.transformer_xl_lm import TransformerXLLM  # Keras: imported when a model is built

    model = TransformerXLLM(config, **model_kwargs)
    if checkpoint is not None:
        load_weights(model, checkpoint)
        return model
    for attempt in range(READ_TRIES):
        _, newest = latest_checkpoint(model_dir)
        if newest is None:
            raise RunFolderError(f"No complete checkpoint in {model_dir}.")
        try:
            load_weights(model, newest)
            return model
        except (RunFolderError, FileNotFoundError):
            if attempt == READ_TRIES - 1 or files.exists(weights_path(newest)):
                raise  # not rotated away: damaged
    raise AssertionError("unreachable")
