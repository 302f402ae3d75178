"""Every path a tf.io.gfile path: TensorFlow's in-memory filesystem (ram://) stands in
for a bucket. Nothing may be written locally."""

import json
import os
import subprocess
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf

from tf_records import build_records, load_corpus_info, load_record_info, verify_records
from txl_io import files
from txl_keras import TransformerXLConfig, run_folder
from txl_keras.export import export_saved_model
from txl_keras.training import TrainConfig, Trainer
from txl_keras.training.average_checkpoints import average_weights

pytestmark = pytest.mark.skipif(keras.config.backend() != "tensorflow", reason="TensorFlow filesystems")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def local_tree(path):
    return sorted(os.path.relpath(os.path.join(d, n), path) for d, dirs, names in os.walk(path)
                  for n in dirs + names)


def make_trainer(records, model_dir, n_token, **overrides):
    config = TransformerXLConfig.from_preset("tiny", n_token=n_token)
    settings = dict(model_dir=model_dir, records_dir=records, train_batch_size=4, eval_batch_size=4,
                    train_steps=4, iterations=2, save_steps=2, learning_rate=3e-3, keep_checkpoint_max=3)
    return Trainer(tf.distribute.get_strategy(), config, TrainConfig(**{**settings, **overrides}),
                   log=lambda *_: None)


def test_records_training_resume_export_average_on_ram(tmp_path, monkeypatch):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "a.txt").write_text("the quick brown fox jumps over the lazy dog.\n" * 200)
    monkeypatch.chdir(tmp_path)
    before = local_tree(tmp_path)
    bucket = "ram://bucket-test/run"
    # the corpus itself sits in the bucket too
    files.makedirs(f"{bucket}/raw")
    files.copy(str(corpus / "a.txt"), f"{bucket}/raw/a.txt")
    records = f"{bucket}/records"
    build_records("text", records, text=f"{bucket}/raw", level="char", splits=["train", "valid"], tgt_len=8,
                  per_host_train_bsz=4, per_host_valid_bsz=4, log=lambda *_: None)
    info = load_record_info(records, "valid", 4, 8)
    verify_records(info)
    n_token = load_corpus_info(records)["vocab_size"]

    model_dir = f"{bucket}/model"
    first = make_trainer(records, model_dir, n_token)
    first.train()
    assert [s for s, _ in run_folder.list_checkpoints(model_dir)] == [2, 4]
    expected = [np.array(w) for w in first.model.get_weights()]
    # a second trainer resumes from the bucket: same weights, same step
    second = make_trainer(records, model_dir, n_token, train_steps=6)
    second.restore_or_warm_start()
    assert int(second.step.numpy()) == 4
    for a, b in zip(expected, second.model.get_weights()):
        np.testing.assert_array_equal(a, np.array(b))
    second.train()
    assert [s for s, _ in run_folder.list_checkpoints(model_dir)] == [2, 4, 6]
    result = second.evaluate(progress=False)
    assert result["tokens"] == info["num_targets"] and np.isfinite(result["loss"])
    assert files.listdir(f"{model_dir}/train")  # TensorBoard summaries

    # warm start and evaluation of a named checkpoint read the bucket too
    third = make_trainer(records, f"{bucket}/warm", n_token, warm_start_path=f"{model_dir}/ckpt-00000006")
    assert third.restore_or_warm_start() and int(third.step.numpy()) == 0
    for a, b in zip(second.model.get_weights(), third.model.get_weights()):
        np.testing.assert_array_equal(np.array(a), np.array(b))

    average_weights([p for _, p in run_folder.list_checkpoints(model_dir)[-2:]], f"{model_dir}/avg.weights.h5")
    assert files.exists(f"{model_dir}/avg.weights.h5")

    run_folder.claim(model_dir, second.config)  # the same model: accepted
    loaded = run_folder.load_trained_model(model_dir)
    export_saved_model(loaded, f"{bucket}/exported")
    served = tf.saved_model.load(f"{bucket}/exported")
    state = served.initial_memory(tf.constant(1))
    tokens = tf.constant([[1, 2, 3]], tf.int32)
    out = served.score(tokens, tokens, state["memory_valid"], *[state[f"mem_{i}"] for i in range(2)])
    direct = loaded(np.array([[1, 2, 3]], "int32"), targets=np.array([[1, 2, 3]], "int32"))["nll"]
    np.testing.assert_allclose(out["nll"].numpy(), np.array(direct), atol=1e-5)

    # conversion output: config, vocabulary and a weights-only checkpoint in the bucket
    converted = f"{bucket}/converted"
    run_folder.claim(converted, loaded.config)
    run_folder.save_checkpoint(converted, 0, loaded, None)
    again = run_folder.load_trained_model(converted)
    for a, b in zip(loaded.get_weights(), again.get_weights()):
        np.testing.assert_array_equal(np.array(a), np.array(b))

    assert local_tree(tmp_path) == before  # nothing local was written


def test_an_interrupted_remote_checkpoint_is_not_listed(tmp_path):
    model_dir = "ram://bucket-test/interrupted"
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    run_folder.save_checkpoint(model_dir, 1, model, {"step": np.array(1)})
    # a crash after the weights of step 2 were written, before the index: not a checkpoint
    run_folder.save_weights(model, f"{model_dir}/ckpt-00000002/model.weights.h5")
    assert run_folder.latest_checkpoint(model_dir)[0] == 1
    index = json.loads(files.read_text(f"{model_dir}/checkpoint.json"))
    assert index["checkpoints"] == ["ckpt-00000001"]


def test_a_bucket_without_network_is_one_clear_line(tmp_path):
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONPATH": ROOT}
    out = subprocess.run(["timeout", "-k", "10", "200", sys.executable, "-m", "tf_records", "--dataset=stdlib",
                          "--records_dir=gs://txl-keras-no-such-bucket/records"],
                         capture_output=True, text=True, env=env, cwd=str(tmp_path))
    assert out.returncode == 1, out.stderr[-2000:]
    errors = [line for line in out.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "gs://txl-keras-no-such-bucket/records" in errors[0], out.stderr[-2000:]
    assert "network" in errors[0] and "Traceback" not in out.stderr
    assert os.listdir(tmp_path) == []  # no local folder named gs:
    with pytest.raises(files.StorageError, match="looks like a URL"):
        files.makedirs("gs:/bucket/x")
