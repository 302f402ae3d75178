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
