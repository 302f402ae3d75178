"""Small corpora, records, subprocess runs and folder snapshots for the training tests."""

import os
import subprocess
import sys

from tf_records.build import build_records

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def write_corpus(path, lines=600):
    """A text with structure a tiny model can learn quickly."""
    words = ["alpha", "beta", "gamma", "delta", "kappa", "omega", "sigma", "theta"]
    with open(path, "w") as f:
        for i in range(lines):
            f.write(" ".join(words[(i * 3 + j) % len(words)] for j in range(5 + i % 4)) + ".\n")
    return path


def build(tmp, batch=4, tgt_len=8, hosts=1, eval_batch=None, splits=("train", "valid")):
    text = write_corpus(os.path.join(tmp, "corpus.txt"))
    records = os.path.join(tmp, "records")
    build_records("text", records, text=text, level="char", splits=list(splits), tgt_len=tgt_len,
                  per_host_train_bsz=batch, per_host_valid_bsz=eval_batch or batch, num_hosts=hosts,
                  log=lambda *_: None)
    assert os.path.exists(os.path.join(records, "corpus-info.json"))
    return records


def train_command(data_dir, model_dir, *extra):
    return [sys.executable, os.path.join(ROOT, "train_gpu.py"), "--config=tiny", f"--data_dir={data_dir}",
            f"--model_dir={model_dir}", "--train_batch_size=4", "--eval_batch_size=4", "--tgt_len=8",
            "--mem_len=8", "--learning_rate=3e-3", "--warmup_steps=0", *extra]


def env(**extra):
    out = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
    out.update(TF_CPP_MIN_LOG_LEVEL="2", PYTHONUNBUFFERED="1", **extra)
    out["PYTHONPATH"] = ROOT + os.pathsep + out.get("PYTHONPATH", "")
    return out


def snapshot(folder):
    """Every file under `folder` with its bytes (and every folder, empty or not)."""
    out = {}
    for directory, names, found in os.walk(folder):
        out[os.path.relpath(directory, folder) + "/"] = None
        for name in found:
            path = os.path.join(directory, name)
            with open(path, "rb") as f:
                out[os.path.relpath(path, folder)] = f.read()
    return out


def run(command, timeout=240, **kwargs):
    return subprocess.run(["timeout", "-k", "10", str(timeout)] + command, capture_output=True, text=True,
                          env=kwargs.pop("env", env()), **kwargs)


def make(tmp_path, records, strategy=None, model_dir="model", dropout=0.0, model=None, **overrides):
    """A Trainer of the tiny preset on `records` (in-process)."""
    import tensorflow as tf

    from tf_records import load_corpus_info
    from txl_keras import TransformerXLConfig
    from txl_keras.training import TrainConfig, Trainer

    n_token = load_corpus_info(records)["vocab_size"]
    cfg = TransformerXLConfig.from_preset("tiny", n_token=n_token, dropout=dropout, **(model or {}))
    settings = dict(model_dir=str(tmp_path / model_dir), records_dir=records, train_batch_size=4,
                    eval_batch_size=4, train_steps=6, iterations=2, save_steps=0, learning_rate=3e-3,
                    max_eval_batch=-1)
    settings.update(overrides)
    return Trainer(strategy or tf.distribute.get_strategy(), cfg, TrainConfig(**settings), log=lambda *_: None)


def weights(trainer):
    import numpy as np

    return [np.array(w) for w in trainer.model.get_weights()]


def summaries(folder):
    """{tag: {step: value}} of the TensorBoard event files in `folder`."""
    import tensorflow as tf
    from tensorflow.core.util import event_pb2

    out = {}
    for name in sorted(os.listdir(folder)):
        for record in tf.data.TFRecordDataset(os.path.join(folder, name)):
            event = event_pb2.Event.FromString(record.numpy())
            for value in event.summary.value:
                array = tf.make_ndarray(value.tensor)
                out.setdefault(value.tag, {})[event.step] = array.item() if array.dtype != object \
                    else array.item().decode()
    return out
