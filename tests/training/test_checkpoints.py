import os

import keras
import numpy as np
import pytest

from txl_keras import run_folder as checkpoints


def small_model():
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    return model


def test_keeps_the_newest_and_lists_them(tmp_path):
    model = small_model()
    for step in range(1, 6):
        checkpoints.save_checkpoint(str(tmp_path), step, model, {"step": np.array(step)}, keep=3)
    assert [s for s, _ in checkpoints.list_checkpoints(str(tmp_path))] == [3, 4, 5]
    step, path = checkpoints.latest_checkpoint(str(tmp_path))
    assert step == 5 and int(checkpoints.load_state(path)["step"]) == 5
    assert sorted(os.listdir(tmp_path)) == ["checkpoint.json", "ckpt-00000003", "ckpt-00000004", "ckpt-00000005"]


def test_crash_while_writing_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    model = small_model()
    checkpoints.save_checkpoint(str(tmp_path), 1, model, {"step": np.array(1)})

    def dying_savez(*args, **kwargs):
        raise KeyboardInterrupt("killed while writing state.npz")

    monkeypatch.setattr(np, "savez", dying_savez)
    with pytest.raises(KeyboardInterrupt):
        checkpoints.save_checkpoint(str(tmp_path), 2, model, {"step": np.array(2)})
    step, path = checkpoints.latest_checkpoint(str(tmp_path))
    assert step == 1
    # Even if a half-written folder were left by SIGKILL, it would not count as complete.
    os.makedirs(tmp_path / "ckpt-00000003")
    (tmp_path / "ckpt-00000003" / "model.weights.h5").write_bytes(b"partial")
    assert checkpoints.latest_checkpoint(str(tmp_path))[0] == 1


def test_a_folder_of_another_model_is_refused_before_anything_is_written(tmp_path):
    from txl_keras import TransformerXLConfig

    config = TransformerXLConfig.from_preset("tiny")
    checkpoints.claim(str(tmp_path), config)
    written = (tmp_path / "config.json").read_bytes()
    assert TransformerXLConfig.from_json(written.decode()) == config
    checkpoints.claim(str(tmp_path), config)  # the same model: accepted
    with pytest.raises(checkpoints.RunFolderError, match=r"d_model: 16 -> 32.*mem_len: 8 -> 4"):
        checkpoints.claim(str(tmp_path), config.replace(d_model=32, mem_len=4))
    assert (tmp_path / "config.json").read_bytes() == written
    assert sorted(os.listdir(tmp_path)) == ["config.json"]
