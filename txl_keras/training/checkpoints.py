"""Crash-safe checkpoints: a folder per step, renamed into place whole, plus an index.

`ckpt-00001000/` holds `model.weights.h5` (Keras weights, loadable by any txl_keras
model of the same config) and `state.npz` (optimizer, step, randomness, every
replica's memory). It is written under a temporary name and renamed when complete;
`checkpoint.json`, rewritten atomically afterwards, lists the complete checkpoints, so
a crash at any moment leaves the previous checkpoint as the latest.
"""

import json
import os
import re
import shutil
import tempfile

import numpy as np

from txl_keras.atomic_files import fsync_dir, atomic_path, atomic_write_text

INDEX = "checkpoint.json"
WEIGHTS = "model.weights.h5"
STATE = "state.npz"
_NAME = re.compile(r"^ckpt-(\d+)$")


def checkpoint_name(step):
    return f"ckpt-{int(step):08d}"


def _complete(path):
    return os.path.isfile(os.path.join(path, WEIGHTS)) and os.path.isfile(os.path.join(path, STATE))


def list_checkpoints(model_dir):
    """`[(step, path)]` of the complete checkpoints, oldest first."""
    index = os.path.join(model_dir, INDEX)
    names = []
    if os.path.exists(index):
        try:
            with open(index) as f:
                names = json.load(f)["checkpoints"]
        except (ValueError, KeyError):
            names = []
    if not names and os.path.isdir(model_dir):
        names = [n for n in os.listdir(model_dir) if _NAME.match(n)]
    found = []
    for name in names:
        match = _NAME.match(name)
        path = os.path.join(model_dir, name)
        if match and _complete(path):
            found.append((int(match.group(1)), path))
    return sorted(found)


def latest_checkpoint(model_dir):
    checkpoints = list_checkpoints(model_dir)
    return checkpoints[-1] if checkpoints else (None, None)


def save_checkpoint(model_dir, step, model, state, keep=5):
    """Write checkpoint `step` (model weights + the numpy arrays of `state`), then drop
    all but the newest `keep`. Returns its path."""
    os.makedirs(model_dir, exist_ok=True)
    final = os.path.join(model_dir, checkpoint_name(step))
    tmp = tempfile.mkdtemp(prefix=checkpoint_name(step) + ".", suffix=".partial", dir=model_dir)
    try:
        model.save_weights(os.path.join(tmp, WEIGHTS))
        with atomic_path(os.path.join(tmp, STATE)) as state_tmp:
            with open(state_tmp, "wb") as f:
                np.savez(f, **state)
        fsync_dir(tmp)
        if os.path.exists(final):
            shutil.rmtree(final)
        os.replace(tmp, final)
        fsync_dir(model_dir)
    finally:
        if os.path.exists(tmp):
            shutil.rmtree(tmp)
    kept = [p for _, p in list_checkpoints(model_dir) if p != final][-(keep - 1):] if keep > 1 else []
    names = [os.path.basename(p) for p in kept] + [os.path.basename(final)]
    atomic_write_text(os.path.join(model_dir, INDEX), json.dumps({"checkpoints": names}, indent=2))
    for entry in os.listdir(model_dir):
        path = os.path.join(model_dir, entry)
        stale = _NAME.match(entry) and entry not in names
        if stale or entry.endswith(".partial"):
            shutil.rmtree(path, ignore_errors=True)
    return final


def load_state(path):
    """The numpy arrays saved beside the weights of a checkpoint folder."""
    with np.load(os.path.join(path, STATE)) as data:
        return {k: data[k] for k in data.files}


def weights_path(path):
    """The Keras weights file of a checkpoint folder (or a weights file itself)."""
    return path if path.endswith(".weights.h5") else os.path.join(path, WEIGHTS)
