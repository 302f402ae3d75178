"""A run folder: what training writes, and what evaluation, export, generation and
conversion read. Any `tf.io.gfile` path (local, gs://, ...).

    model_dir/
      config.json          the model's TransformerXLConfig: the folder's identity
      vocab.json           the vocabulary the records were encoded with
      checkpoint.json      the index of complete checkpoints, oldest first (the commit marker)
      ckpt-00001000/       model.weights.h5 (Keras weights) + state.npz (optimizer, step,
                           randomness, every replica's memory; absent in converted weights)
      best.json            with --eval_steps: the step and validation results of the best
      best-00000800.weights.h5   weights so far (by validation loss), the file it names
      train/  eval/        TensorBoard summaries
      eval_results.json

A checkpoint counts only once the index names it, and the index is rewritten (atomically)
after the checkpoint's files are complete: a crash at any moment leaves the previous
checkpoint as the latest. Locally the checkpoint folder is also written under a temporary
name and renamed into place whole.
"""

import io
import json
import os
import re
import shutil
import tempfile

import numpy as np

from tf_records import files
from txl_keras.models.config import TransformerXLConfig
from txl_keras.models.transformer_xl_lm import TransformerXLLM

CONFIG = "config.json"
VOCAB = "vocab.json"
INDEX = "checkpoint.json"
WEIGHTS = "model.weights.h5"
STATE = "state.npz"
BEST = "best.json"
_NAME = re.compile(r"^ckpt-(\d+)$")


class RunFolderError(ValueError):
    """A run folder that is missing, damaged or holds another model."""


def checkpoint_name(step):
    return f"ckpt-{int(step):08d}"


# -- the folder's identity ----------------------------------------------------------------------


def _read(model_dir, name, parse, fix):
    """`parse(text)` of a file of the run folder, or None when it is absent; a damaged
    file is a RunFolderError naming it and `fix`."""
    path = files.join(model_dir, name)
    if not files.exists(path):
        return None
    try:
        return parse(files.read_text(path))
    except ValueError as e:
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


def claim(model_dir, config):
    """Make `model_dir` the folder of `config`: write config.json if it has none, accept
    an identical one, refuse (writing nothing) one of another model."""
    old = read_config(model_dir)
    if old is None:
        files.makedirs(model_dir)
        files.atomic_write(files.join(model_dir, CONFIG), config.to_json())
        return
    changed = config_differences(old, config)
    if changed:
        raise RunFolderError(
            f"{files.join(model_dir, CONFIG)} holds another model ({'; '.join(changed[:6])}); "
            "use another --model_dir, or the folder's own settings (--config="
            f"{files.join(model_dir, CONFIG)})."
        )


# -- checkpoints ----------------------------------------------------------------------------------


def _complete(path):
    return files.exists(files.join(path, WEIGHTS))


def _indexed_names(model_dir):
    path = files.join(model_dir, INDEX)
    if not files.exists(path):
        return None
    try:
        names = json.loads(files.read_text(path))["checkpoints"]
    except (ValueError, KeyError, TypeError):
        return None
    return [n for n in names if isinstance(n, str)]


def list_checkpoints(model_dir):
    """`[(step, path)]` of the complete checkpoints, oldest first. The index decides; a
    local folder without an index is listed by its checkpoint folders."""
    names = _indexed_names(model_dir)
    if names is None and files.is_local(model_dir):
        names = [n for n in files.listdir(model_dir) if _NAME.match(n)]
    found = []
    for name in names or []:
        match = _NAME.match(name)
        path = files.join(model_dir, name)
        if match and _complete(path):
            found.append((int(match.group(1)), path))
    return sorted(found)


def latest_checkpoint(model_dir):
    checkpoints = list_checkpoints(model_dir)
    return checkpoints[-1] if checkpoints else (None, None)


def _write_checkpoint_files(folder, model, state):
    save_weights(model, files.join(folder, WEIGHTS))
    if state is not None:
        buffer = io.BytesIO()
        np.savez(buffer, **state)
        files.atomic_write(files.join(folder, STATE), buffer.getvalue())


def save_checkpoint(model_dir, step, model, state, keep=5):
    """Write checkpoint `step` (model weights + the numpy arrays of `state`, which may be
    None), then keep only the newest `keep` (>= 1). Returns its path."""
    if not isinstance(keep, int) or keep < 1:
        raise ValueError(f"Expected `keep` to be a positive integer. Received: keep={keep!r}")
    files.makedirs(model_dir)
    final = files.join(model_dir, checkpoint_name(step))
    if files.is_local(model_dir):
        tmp = tempfile.mkdtemp(prefix=checkpoint_name(step) + ".", suffix=".partial", dir=model_dir)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o777 & ~umask)  # as a plain mkdir would create it
        try:
            _write_checkpoint_files(tmp, model, state)
            files.fsync_dir(tmp)
            if os.path.exists(final):
                shutil.rmtree(final)
            os.replace(tmp, final)
            files.fsync_dir(model_dir)
        finally:
            if os.path.exists(tmp):
                shutil.rmtree(tmp)
    else:  # object stores: no atomic folder rename; the index below is the commit
        _write_checkpoint_files(final, model, state)
    kept = [p for _, p in list_checkpoints(model_dir) if p != final][-(keep - 1):] if keep > 1 else []
    names = [files.basename(p) for p in kept] + [files.basename(final)]
    files.atomic_write(files.join(model_dir, INDEX), json.dumps({"checkpoints": names}, indent=2))
    for entry in files.listdir(model_dir):
        stale = _NAME.match(entry) and entry not in names
        if stale or entry.endswith(".partial"):
            files.remove(files.join(model_dir, entry))
    return final


def read_best(model_dir):
    """The record of the best weights so far (`{"step", "loss", ..., "weights"}`), or None."""
    return _read(model_dir, BEST, json.loads, "delete it to start a new record of the best weights")


def save_best(model_dir, model, step, results):
    """Keep `model`'s weights as the best so far: the weights file first, then best.json
    naming it (the commit), then the file it replaces is removed. Returns its path."""
    name = f"best-{int(step):08d}.weights.h5"
    save_weights(model, files.join(model_dir, name))
    previous = read_best(model_dir)
    files.atomic_write(files.join(model_dir, BEST), json.dumps({"step": int(step), **results, "weights": name},
                                                               indent=2))
    if previous and previous.get("weights") not in (None, name):
        old = files.join(model_dir, previous["weights"])
        if files.exists(old):
            files.remove(old)
    return files.join(model_dir, name)


def set_aside(path):
    """Rename a damaged checkpoint folder to `<name>.damaged[-N]` (kept for inspection,
    out of the way of a new checkpoint of its step). Returns the new path."""
    target, n = f"{path}.damaged", 1
    while files.exists(target):
        n += 1
        target = f"{path}.damaged-{n}"
    files.rename(path, target)
    return target


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
    """`model.save_weights` to any filesystem, atomically."""
    with files.local_output(path) as local:
        if not local.endswith(".weights.h5"):  # Keras insists on the suffix
            local_dir = tempfile.mkdtemp(prefix="txl-weights-")
            try:
                staged = os.path.join(local_dir, WEIGHTS)
                model.save_weights(staged)
                shutil.copyfile(staged, local)
            finally:
                shutil.rmtree(local_dir, ignore_errors=True)
        else:
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


def load_trained_model(model_dir, checkpoint=None, **model_kwargs):
    """A TransformerXLLM from a run folder (`config.json` + a checkpoint, default the
    latest)."""
    config = require_config(model_dir)
    if checkpoint is None:
        _, checkpoint = latest_checkpoint(model_dir)
        if checkpoint is None:
            raise RunFolderError(f"No complete checkpoint in {model_dir}.")
    model = TransformerXLLM(config, **model_kwargs)
    load_weights(model, checkpoint)
    return model
