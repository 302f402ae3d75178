import keras
import numpy as np
import pytest

from txl_keras import TransformerXLConfig, TransformerXLLM
from txl_keras.training.average_checkpoints import average_weights
from txl_keras.run_folder import save_checkpoint


def test_average_of_checkpoints_is_the_mean_of_their_weights(tmp_path):
    model = TransformerXLLM(TransformerXLConfig.from_preset("tiny"))
    model.build((None, 8))
    snapshots = []
    for step in range(1, 4):
        for v in model.trainable_variables:
            v.assign(np.random.default_rng(step).normal(size=v.shape).astype("float32"))
        snapshots.append([np.array(w) for w in model.get_weights()])
        save_checkpoint(str(tmp_path), step, model, {"step": np.array(step)})
    paths = [str(tmp_path / f"ckpt-{s:08d}") for s in (2, 3)]
    average_weights(paths, str(tmp_path / "avg.weights.h5"))
    fresh = TransformerXLLM(TransformerXLConfig.from_preset("tiny"))
    fresh.build((None, 8))
    fresh.load_weights(str(tmp_path / "avg.weights.h5"))
    for got, a, b in zip(fresh.get_weights(), snapshots[1], snapshots[2]):
        np.testing.assert_allclose(keras.ops.convert_to_numpy(got), (a + b) / 2, rtol=1e-6)
    with pytest.raises(ValueError, match="No checkpoint"):
        average_weights([], str(tmp_path / "none.weights.h5"))


def test_checkpoints_of_two_models_are_named_and_an_output_is_never_overwritten(tmp_path):
    for name, d_model in (("a", 16), ("b", 24)):
        model = TransformerXLLM(TransformerXLConfig.from_preset("tiny", d_model=d_model))
        save_checkpoint(str(tmp_path / name), 1, model, None)
    paths = [str(tmp_path / "a" / "ckpt-00000001"), str(tmp_path / "b" / "ckpt-00000001")]
    with pytest.raises(ValueError, match=r"b/ckpt-00000001 holds .* of shape .* checkpoints of two models"):
        average_weights(paths, str(tmp_path / "avg.weights.h5"))
    assert not (tmp_path / "avg.weights.h5").exists()
    average_weights(paths[:1], str(tmp_path / "avg.weights.h5"))
    with pytest.raises(FileExistsError, match="avg.weights.h5 exists; nothing was overwritten"):
        average_weights(paths[:1], str(tmp_path / "avg.weights.h5"))
