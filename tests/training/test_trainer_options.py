"""The trainer's options, each against an independent expectation: the plain step, the
weights of another run, the documented loss scaling, the folder on disk."""

import os
from unittest import mock

import numpy as np
import pytest
from conftest import randomize
from helpers import build, make, weights

from txl_keras import run_folder


@pytest.fixture(scope="module")
def records(tmp_path_factory):
    return build(str(tmp_path_factory.mktemp("records")))


def test_chunks_parts_and_xla_train_the_weights_of_the_one_piece_step(tmp_path, records, monkeypatch):
    runs = {}
    cases = (("one piece", {"concurrent_parts": 1}), ("parts", {"concurrent_parts": 2}),
             ("chunks", {"batch_chunk": 2, "concurrent_parts": 1}),
             ("chunks of parts", {"batch_chunk": 2, "concurrent_parts": 2}), ("xla", {"xla": True}))
    for name, options in cases:
        trainer = make(tmp_path, records, model_dir=name, train_steps=4, **options)
        trainer.train()
        runs[name] = weights(trainer)
    monkeypatch.delenv("TF_NUM_INTEROP_THREADS", raising=False)
    assert make(tmp_path, records, model_dir="p").parts == 2  # the default on a CPU
    for name, _ in cases[1:]:
        for a, b in zip(runs["one piece"], runs[name]):
            np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-5, err_msg=name)
    assert any(not np.allclose(a, b) for a, b in zip(runs["one piece"], weights(make(tmp_path, records))))


def test_batch_chunks_run_one_after_another(tmp_path):
    """`batch_chunk` is there to fit a batch in less memory: the chunks' activations must
    not be live at once (in a graph, independent chunks would run side by side)."""
    import tensorflow as tf

    records = build(str(tmp_path), batch=16, tgt_len=64)
    peaks = {}
    for chunks in (1, 2):
        trainer = make(tmp_path, records, model_dir=f"c{chunks}", train_batch_size=16, train_steps=1,
                       iterations=1, batch_chunk=chunks, concurrent_parts=1, model=dict(tgt_len=64, mem_len=64))
        trainer.train()  # traced and warm
        tf.config.experimental.reset_memory_stats("CPU:0")
        base = tf.config.experimental.get_memory_info("CPU:0")["current"]
        trainer.tc.train_steps = 3
        trainer.train()
        peaks[chunks] = tf.config.experimental.get_memory_info("CPU:0")["peak"] - base
    assert peaks[2] < 0.75 * peaks[1], peaks  # about half: one chunk's activations at a time


def test_concurrent_parts_default_and_domain(monkeypatch):
    from txl_keras.training import TrainConfig
    from txl_keras.training.trainer import concurrent_parts

    def config(**fields):
        return TrainConfig(model_dir="m", records_dir="r", train_batch_size=12, **fields)

    for value, parts in (("1", 1), ("2", 2), ("many", 2)):  # TensorFlow's environment setting
        monkeypatch.setenv("TF_NUM_INTEROP_THREADS", value)
        assert concurrent_parts(config(), 12, compiled=False) == parts, value
    monkeypatch.delenv("TF_NUM_INTEROP_THREADS")
    assert concurrent_parts(config(), 12, compiled=False) == 2  # a CPU, op by op
    assert concurrent_parts(config(), 12, compiled=True) == 1  # under XLA
    assert concurrent_parts(config(batch_chunk=4), 12, compiled=False) == 1  # chunks of 3 rows
    assert concurrent_parts(config(concurrent_parts=3), 12, compiled=False) == 3
    with mock.patch("tensorflow.config.threading.get_inter_op_parallelism_threads", return_value=1):
        assert concurrent_parts(config(), 12, compiled=False) == 1  # nothing would run side by side
        assert concurrent_parts(config(concurrent_parts=2), 12, compiled=False) == 2
    with pytest.raises(ValueError, match="`concurrent_parts`=3 must divide each chunk of 4 streams"):
        concurrent_parts(config(concurrent_parts=3), 4, compiled=False)
    with pytest.raises(ValueError, match="`batch_chunk`=4 must divide each replica's batch of 6 streams"):
        concurrent_parts(config(batch_chunk=4), 6, compiled=False)


def test_mixed_float16_scales_the_loss_and_skips_overflowing_steps(tmp_path, records):
    trainer = make(tmp_path, records, precision="mixed_float16", train_steps=1, iterations=1)
    assert trainer.model.compute_dtype == "float16" and trainer.model.variable_dtype == "float32"
    assert float(trainer.loss_scale.numpy()) == 2.0**15  # the documented initial scale
    before = weights(trainer)
    trainer.loss_scale.assign(2.0**60)  # float16 gradients overflow
    trainer.train()
    assert int(trainer.step.numpy()) == 1 and int(trainer.good_steps.numpy()) == 0
    assert float(trainer.loss_scale.numpy()) == 2.0**59  # halved
    for a, b in zip(before, weights(trainer)):
        np.testing.assert_array_equal(a, b)  # the step was skipped
    trainer.loss_scale.assign(2.0**8)
    trainer.tc.train_steps = 4
    trainer.train()
    assert int(trainer.good_steps.numpy()) == 3 and float(trainer.loss_scale.numpy()) == 2.0**8
    after = weights(trainer)
    assert all(np.isfinite(w).all() for w in after)
    assert any(not np.array_equal(a, b) for a, b in zip(before, after))


def test_mixed_bfloat16_trains(tmp_path, records):
    trainer = make(tmp_path, records, precision="mixed_bfloat16", train_steps=4)
    assert trainer.model.compute_dtype == "bfloat16" and trainer.model.variable_dtype == "float32"
    before = weights(trainer)
    trainer.train()
    after = weights(trainer)
    assert all(np.isfinite(w).all() for w in after)
    assert any(not np.array_equal(a, b) for a, b in zip(before, after))
    assert float(trainer.evaluate(progress=False, summaries=False)["loss"]) < np.log(trainer.config.n_token)


def test_warm_start_takes_the_weights_but_not_the_optimizer_or_the_step(tmp_path, records):
    source = make(tmp_path, records, model_dir="source", train_steps=4, save_steps=4)
    source.train()
    path = run_folder.latest_checkpoint(source.tc.model_dir)[1]
    warm = make(tmp_path, records, model_dir="warm", warm_start_path=path)
    assert warm.restore_or_warm_start()
    for a, b in zip(weights(source), weights(warm)):
        np.testing.assert_array_equal(a, b)
    assert int(warm.step.numpy()) == 0
    assert all(not np.any(v.numpy()) for v in warm.optimizer.state)  # fresh moments
    assert any(np.any(v.numpy()) for v in source.optimizer.state)


def test_keep_checkpoint_max_and_the_folders_mode(tmp_path, records):
    trainer = make(tmp_path, records, train_steps=10, save_steps=2, keep_checkpoint_max=3)
    trainer.train()
    model_dir = trainer.tc.model_dir
    assert [step for step, _ in run_folder.list_checkpoints(model_dir)] == [6, 8, 10]
    assert sorted(n for n in os.listdir(model_dir) if n.startswith("ckpt-")) == \
        ["ckpt-00000006", "ckpt-00000008", "ckpt-00000010"]
    umask = os.umask(0)
    os.umask(umask)
    for name in ("ckpt-00000010", "train"):  # as every folder the trainer creates
        assert os.stat(os.path.join(model_dir, name)).st_mode & 0o777 == 0o777 & ~umask, name
    for name in (run_folder.WEIGHTS, run_folder.STATE):
        assert os.stat(os.path.join(model_dir, "ckpt-00000010", name)).st_mode & 0o777 == 0o666 & ~umask


def test_several_streams_on_two_replicas_score_the_loss_of_a_direct_computation(tmp_path, mirrored):
    """Eval batch 6 on 2 replicas (3 streams each), the memory's keys and values cached,
    same_length, a shorter last chunk and a padded last stream: the reported loss equals
    scoring each stream's tokens in order with the model directly. The streams are cut
    by the documented rule: ceil((N - 1) / 6) targets each, contiguous, the last padded."""
    import tensorflow as tf

    from tf_records import load_corpus

    tgt, mem_len = 5, 12
    records = build(str(tmp_path), eval_batch=6)
    build(str(tmp_path), eval_batch=6, tgt_len=tgt, splits=("valid",))
    trainer = make(tmp_path, records, strategy=mirrored, eval_batch_size=6, eval_tgt_len=tgt,
                   eval_mem_len=mem_len, eval_clamp_len=6, eval_same_length=True)
    randomize(trainer.model, scale=0.5)  # untrained weights, far from the initialisation
    assert trainer.model.backbone.can_cache_kv and trainer.replicas == 2
    result = trainer.evaluate(progress=False, summaries=False)
    ids = load_corpus("text", text=str(tmp_path / "corpus.txt"), level="char").split_ids["valid"]()
    per = -(-(len(ids) - 1) // 6)
    padded = np.concatenate([ids, np.full(6 * per + 1 - len(ids), -1)]).astype("int32")
    forward = tf.function(lambda x, y, mems: trainer.model(x, targets=y, mems=mems, mem_len=mem_len, clamp_len=6,
                                                           same_length=True))  # not eager: fast
    total = 0.0
    for r in range(6):
        stream, mems = padded[r * per: r * per + per + 1], None
        for t in range(0, per, tgt):
            x, y = stream[None, t:t + tgt], stream[None, t + 1:t + tgt + 1]
            x = x[:, : y.shape[1]]
            out = forward(np.maximum(x, 0), np.maximum(y, 0), mems)
            mems = out["mems"]
            total += float(np.sum(np.where(y >= 0, np.asarray(out["nll"]), 0.0)))
    assert result["tokens"] == len(ids) - 1 == result["expected_tokens"]
    assert per * 6 > len(ids) - 1 and per % tgt  # a padded stream and a shorter last chunk
    assert result["loss"] == pytest.approx(total / (len(ids) - 1), rel=1e-5)


@pytest.mark.parametrize("precision, clip", [("float32", 0.0), ("float32", 1e-3), ("mixed_float16", 1e-3)])
def test_step_gradients_are_the_loss_gradients_unscaled_and_clipped(tmp_path, records, precision, clip):
    """The step's gradients and global norm against the loss's own gradients (a plain tape,
    no loss scale) and clipping written out in numpy: `g * min(1, clip / norm)`."""
    import tensorflow as tf

    trainer = make(tmp_path, records, precision=precision, clip=clip)
    trainer.loss_scale.assign(2.0**8)  # used only by float16 (1 elsewhere)
    ids = np.random.default_rng(0).integers(0, trainer.config.n_token, (4, 9))
    inputs, targets = tf.constant(ids[:, :-1], tf.int32), tf.constant(ids[:, 1:], tf.int32)
    mems, valid = trainer.memory.read()
    with tf.GradientTape() as tape:
        out = trainer.model(inputs, targets=targets, mems=mems, memory_valid=valid, training=True)
        loss = tf.reduce_sum(tf.cast(out["nll"], tf.float32)) / ids[:, 1:].size  # one replica's tokens
    reference = [np.asarray(tf.convert_to_tensor(g), np.float64)
                 for g in tape.gradient(loss, trainer.model.trainable_variables)]
    norm = np.sqrt(sum(float((g**2).sum()) for g in reference))
    factor = min(1.0, clip / norm) if clip > 0 else 1.0
    assert clip == 0 or factor < 0.1  # the clip applies

    grads, mean_nll, gnorm, finite = trainer.strategy.run(trainer._replica_step, args=(inputs, targets))
    assert bool(finite)
    np.testing.assert_allclose(float(mean_nll), float(loss), rtol=1e-3 if precision == "mixed_float16" else 1e-6)
    tolerance = 1e-2 if precision == "mixed_float16" else 1e-5
    np.testing.assert_allclose(float(gnorm), norm, rtol=tolerance)
    got = [np.asarray(g, np.float64) for g in grads]
    error = np.sqrt(sum(float(((a - b * factor) ** 2).sum()) for a, b in zip(got, reference)))
    assert error <= tolerance * norm * factor
