"""The trainers' step arithmetic (`txl_keras.training.step`) against numpy: the global norm,
float16's unscaling, clipping `g * min(1, clip / norm)`, and which steps advance the memory,
apply Adam or halt the run."""

import math

import numpy as np
import pytest
from keras import ops

from txl_keras.training.step import checked_gradients, halts, piece_loss
from txl_keras.training.train_config import TrainConfig


def _grads(scale=1.0):
    rng = np.random.default_rng(3)
    return [rng.normal(size=(3, 4)).astype("float32") * scale, rng.normal(size=(5,)).astype("float32") * scale]


@pytest.mark.parametrize("clip, loss_scale", [(0.0, None), (0.25, None), (0.25, 256.0), (100.0, None)])
def test_gradients_are_unscaled_then_clipped_to_the_global_norm(clip, loss_scale):
    scaled = _grads(scale=loss_scale or 1.0)
    grads, gnorm, forward_ok, finite = checked_gradients(
        [ops.convert_to_tensor(g) for g in scaled], ops.convert_to_tensor(3.5), clip,
        None if loss_scale is None else ops.convert_to_tensor(loss_scale))
    plain = [g.astype(np.float64) / (loss_scale or 1.0) for g in scaled]
    norm = math.sqrt(sum(float(np.sum(g**2)) for g in plain))
    factor = min(1.0, clip / norm) if clip > 0 else 1.0
    assert clip != 0.25 or factor < 0.2  # the bound applies where it is small
    np.testing.assert_allclose(float(gnorm), norm, rtol=1e-6)
    for got, want in zip(grads, plain):
        np.testing.assert_allclose(ops.convert_to_numpy(got), want * factor, rtol=1e-5, atol=1e-7)
    assert bool(forward_ok) and bool(finite)


def test_a_non_finite_forward_pass_or_gradient_is_caught_and_halts_only_when_not_skipped():
    good = [ops.convert_to_tensor(g) for g in _grads()]
    overflowing = [ops.convert_to_tensor(np.array([np.inf, 1.0], "float32"))]
    cases = {"nan loss": (good, float("nan"), False, False), "inf gradient": (overflowing, 2.0, True, False),
             "finite": (good, 2.0, True, True)}
    for name, (grads, nll, forward_ok_wanted, finite_wanted) in cases.items():
        _, _, forward_ok, finite = checked_gradients(grads, ops.convert_to_tensor(nll), 0.25)
        assert (bool(forward_ok), bool(finite)) == (forward_ok_wanted, finite_wanted), name
    stop, skip = TrainConfig(skip_nonfinite=False), TrainConfig(skip_nonfinite=True)
    false, true = ops.convert_to_tensor(False), ops.convert_to_tensor(True)
    assert bool(halts(false, stop)) and not bool(halts(false, skip))
    assert not bool(halts(false, stop, rescales=True))  # float16 halves its loss scale instead
    assert not bool(halts(true, stop))


def test_a_pieces_loss_is_its_share_of_the_global_mean():
    nll = np.random.default_rng(4).uniform(0, 5, size=(2, 6)).astype("float32")
    pieces = [piece_loss(ops.convert_to_tensor(nll[i:i + 1]), float(nll.size)) for i in range(2)]
    assert sum(float(loss) for loss, _ in pieces) == pytest.approx(float(nll.astype(np.float64).mean()), rel=1e-6)
    assert sum(float(total) for _, total in pieces) == pytest.approx(float(nll.astype(np.float64).sum()), rel=1e-6)
