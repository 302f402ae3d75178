import math
import re

import numpy as np
import pytest
import tensorflow as tf
from conftest import randomize
from helpers import build, make, weights

from txl_keras.models.transformer_xl import TransformerXL
from txl_keras.training import NonFiniteLossError, latest_checkpoint


def test_two_replicas_equal_one_device_with_the_same_global_batch(tmp_path, mirrored):
    records = build(str(tmp_path))
    one = make(tmp_path, records, model_dir="one")
    one.train()
    two = make(tmp_path, records, strategy=mirrored, model_dir="two")
    assert two.replicas == 2 and two.per_replica == 2
    two.train()
    for a, b in zip(weights(one), weights(two)):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
    # each replica kept the memory of its own streams: together they equal one device's
    one_mem = one.memory.memory_variables[0].numpy()
    two_mem = np.concatenate([v.numpy() for v in mirrored.experimental_local_results(
        two.memory.memory_variables[0].value)])
    np.testing.assert_allclose(one_mem, two_mem, rtol=1e-4, atol=1e-5)


def train_losses(trainer):
    """The training losses the trainer logs (one per log line; the progress lines of a slow
    run carry none)."""
    lines = []
    trainer.log = lines.append
    trainer.train()
    found = [re.search(r"^step .*\| loss ([0-9.]+) ", line) for line in lines]
    return np.array([float(m.group(1)) for m in found if m])


def test_two_replicas_with_dropout_train_like_one_device(tmp_path, mirrored):
    """With dropout the replicas draw other masks than one device, so the losses differ,
    but by no more than other masks on one device make them differ."""
    records = build(str(tmp_path))

    def losses(name, strategy=None, salt=0):
        trainer = make(tmp_path, records, strategy, model_dir=name, dropout=0.3, model={"dropatt": 0.3},
                       train_steps=8, iterations=2)
        for v in trainer.seed_states:  # other masks, the same initial weights
            v.assign(v.numpy() + np.array([salt, 0]))
        return train_losses(trainer)

    one = [losses(f"one_{k}", salt=1000 * k) for k in range(2)]
    spread = np.abs(one[0] - one[1]).mean()
    assert spread > 0
    two = losses("two", mirrored)
    assert np.abs(two - one[0]).mean() <= 3 * spread


def test_memory_persists_across_host_loop_calls(tmp_path):
    records = build(str(tmp_path))
    per_step = make(tmp_path, records, model_dir="a", iterations=1)
    per_step.train()
    batched = make(tmp_path, records, model_dir="b", iterations=6)
    batched.train()
    for a, b in zip(weights(per_step), weights(batched)):
        np.testing.assert_array_equal(a, b)
    assert int(per_step.memory.valid_variable.numpy()) == per_step.config.mem_len
    assert np.abs(per_step.memory.memory_variables[1].numpy()).sum() > 0


@pytest.mark.parametrize("eval_settings", [  # other tgt/mem/clamp/same_length: test_trainer_options.py
    {},
    {"model": {"pre_lnorm": True, "mem_init": "zeros"}},  # cached keys/values of a zero memory
    # the position keys projected in each segment, not kept for the pass (POSITION_KEYS_SHARE)
    {"model": {"pre_lnorm": True, "mem_init": "zeros"}, "position_keys_share": 0.0},
    # an adaptive softmax scores 3 segments per call (SCORE_TOKENS), the last group partial
    {"model": {"cutoffs": [5, 12], "div_val": 2, "d_embed": 16}, "score_tokens": 24},
])
def test_evaluation_equals_direct_computation_over_the_split(tmp_path, monkeypatch, eval_settings):
    from tf_records import load_corpus
    from txl_keras.training import evaluation

    eval_settings = dict(eval_settings)
    monkeypatch.setattr(evaluation, "SCORE_TOKENS", eval_settings.pop("score_tokens", 0))
    keep_positions = "position_keys_share" not in eval_settings  # a small model keeps them
    monkeypatch.setattr(evaluation, "POSITION_KEYS_SHARE",
                        eval_settings.pop("position_keys_share", evaluation.POSITION_KEYS_SHARE))
    projected = []
    project_positions = TransformerXL.project_positions
    monkeypatch.setattr(TransformerXL, "project_positions",
                        lambda self, *args: projected.append(args) or project_positions(self, *args))
    tgt = eval_settings.get("eval_tgt_len", 8)
    records = build(str(tmp_path), eval_batch=1, tgt_len=8)
    if tgt != 8:
        build(str(tmp_path), eval_batch=1, tgt_len=tgt, splits=("valid",))
    trainer = make(tmp_path, records, eval_batch_size=1, **eval_settings)
    group = trainer.evaluation(*trainer.eval_settings()).group
    assert group == (3 if trainer.config.cutoffs else None)
    trainer.train()
    if "model" in eval_settings:  # layer-norm biases far from zero: a zero memory's keys are not zero
        randomize(trainer.model, scale=0.5)
    result = trainer.evaluate(progress=False)
    assert bool(projected) == keep_positions
    corpus = load_corpus("text", text=str(tmp_path / "corpus.txt"), level="char")
    ids = corpus.split_ids["valid"]()
    assert result["tokens"] == len(ids) - 1 == result["expected_tokens"]
    assert group is None or -(-(len(ids) - 1) // tgt) % group  # a partial last group was scored
    mem_len = eval_settings.get("eval_mem_len", trainer.config.mem_len)
    kwargs = dict(mem_len=mem_len, clamp_len=eval_settings.get("eval_clamp_len"),
                  same_length=eval_settings.get("eval_same_length"))
    forward = tf.function(lambda x, y, mems: trainer.model(x, targets=y, mems=mems, **kwargs))  # not eager: fast
    total, mems = 0.0, None
    for t in range(0, len(ids) - 1, tgt):
        x, y = ids[None, t:t + tgt], ids[None, t + 1:t + tgt + 1]
        x = x[:, : y.shape[1]]
        out = forward(x, y, mems)
        mems = out["mems"]
        total += float(np.sum(out["nll"]))
    assert result["loss"] == pytest.approx(total / (len(ids) - 1), rel=1e-5)
    assert result["bpc"] == pytest.approx(result["loss"] / math.log(2))


@pytest.mark.parametrize("batch", [1, 4])
def test_position_keys_are_kept_by_their_share_of_the_held_bytes(tmp_path, monkeypatch, batch):
    from txl_keras.training import evaluation

    trainer = make(tmp_path, build(str(tmp_path), eval_batch=batch), eval_batch_size=batch)
    settings, tgt_len = trainer.eval_settings()
    kept = trainer.evaluation(settings, tgt_len)
    assert kept.position_keys  # a small model keeps them at the default share
    # The bytes counted here: float32 weights, the rings' variables, one key per distinct distance.
    held = 4 * trainer.model.count_params() + sum(4 * math.prod(ring.shape) for ring in kept.cache.rings)
    distances = settings.mem_len + tgt_len  # one per distance (clamp_len <= 0: none clamped)
    if settings.clamp_len and settings.clamp_len > 0:
        distances = min(distances, settings.clamp_len + 1)
    keys = 4 * settings.n_layer * settings.n_head * settings.d_head * distances
    assert [tuple(k.shape) for k in kept.position_keys] == [(settings.n_head, settings.d_head, distances)] * \
        settings.n_layer
    for share, keep in ((keys / held * 1.001, True), (keys / held * 0.999, False)):
        monkeypatch.setattr(evaluation, "POSITION_KEYS_SHARE", share)
        trainer._evaluations.clear()
        assert bool(trainer.evaluation(settings, tgt_len).position_keys) == keep


def test_two_replicas_score_held_segments_like_one_device(tmp_path, mirrored, monkeypatch):
    """An adaptive softmax scores several segments per call, each replica its own held
    segments: two replicas (3 segments per call each) give one device's evaluation."""
    from txl_keras.training import evaluation

    monkeypatch.setattr(evaluation, "SCORE_TOKENS", 48)
    records = build(str(tmp_path))
    adaptive = {"cutoffs": [5, 12], "div_val": 2, "d_embed": 16}
    one = make(tmp_path, records, model_dir="one", model=adaptive)
    two = make(tmp_path, records, strategy=mirrored, model_dir="two", model=adaptive)
    two.model.set_weights(one.model.get_weights())
    assert (one.evaluation(*one.eval_settings()).group, two.evaluation(*two.eval_settings()).group) == (1, 3)
    a, b = one.evaluate(progress=False), two.evaluate(progress=False)
    assert a["tokens"] == b["tokens"] == a["expected_tokens"]
    assert b["loss"] == pytest.approx(a["loss"], rel=1e-5)


def test_non_finite_loss_stops_and_keeps_the_last_good_checkpoint(tmp_path):
    records = build(str(tmp_path))
    trainer = make(tmp_path, records, train_steps=2, save_steps=2)
    trainer.train()
    good = weights(trainer)
    trainer.tc.train_steps = 6
    variable = trainer.model.trainable_variables[3]
    variable.assign(tf.fill(variable.shape, np.nan))
    with pytest.raises(NonFiniteLossError, match="at step 3; training stopped.*last good checkpoint"):
        trainer.train()
    assert latest_checkpoint(trainer.tc.model_dir)[0] == 2
    assert int(trainer.step.numpy()) == 2
    skipping = make(tmp_path, records, train_steps=6, save_steps=0, skip_nonfinite=True)
    skipping.restore_or_warm_start()
    variable = skipping.model.trainable_variables[3]
    variable.assign(tf.fill(variable.shape, np.nan))
    memory = [v.numpy() for v in skipping.memory.memory_variables + [skipping.memory.valid_variable]]
    assert all(np.isfinite(m).all() for m in memory)
    skipping.train()  # skips every step now, without raising
    assert int(skipping.step.numpy()) == 6
    np.testing.assert_array_equal(weights(skipping)[0], good[0])
    for kept, now in zip(memory, skipping.memory.memory_variables + [skipping.memory.valid_variable]):
        np.testing.assert_array_equal(now.numpy(), kept)  # no non-finite forward pass wrote it


def test_interrupted_checkpoint_write_then_resume_is_exact(tmp_path, monkeypatch):
    records = build(str(tmp_path))
    settings = dict(train_steps=6, save_steps=2, dropout=0.2)  # dropout: randomness is restored too
    reference = make(tmp_path, records, model_dir="ref", **settings)
    reference.train()
    crashing = make(tmp_path, records, model_dir="crash", **settings)
    real_savez = np.savez
    calls = {"n": 0}

    def dying(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 2:  # the checkpoint of step 4, mid-write
            raise KeyboardInterrupt
        return real_savez(*args, **kwargs)

    monkeypatch.setattr(np, "savez", dying)
    with pytest.raises(KeyboardInterrupt):
        crashing.train()
    monkeypatch.setattr(np, "savez", real_savez)
    assert latest_checkpoint(str(tmp_path / "crash"))[0] == 2
    resumed = make(tmp_path, records, model_dir="crash", **settings)
    resumed.train()
    for a, b in zip(weights(reference), weights(resumed)):
        np.testing.assert_array_equal(a, b)


def test_records_of_another_layout_are_refused(tmp_path, mirrored):
    records = build(str(tmp_path))
    trainer = make(tmp_path, records, train_batch_size=8)
    with pytest.raises(ValueError, match="built for another layout.*--per_host_train_bsz=8"):
        trainer.train()
    with pytest.raises(ValueError, match="not divisible"):
        make(tmp_path, records, strategy=mirrored, train_batch_size=3, eval_batch_size=4)
