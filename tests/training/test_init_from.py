"""Fine-tuning with the trainer: `train_gpu.py --init_from=<run folder or preset folder>`
starts at the source model's validation loss, on records built in its vocabulary from
your text (`--dataset=text --text=...`), and refuses records of another vocabulary."""

import json
import os
import sys

import pytest
from helpers import ROOT, run, snapshot, write_corpus

TRAIN = [sys.executable, os.path.join(ROOT, "train_gpu.py")]
COMMON = ["--train_batch_size=4", "--eval_batch_size=4", "--learning_rate=3e-3", "--warmup_steps=0",
          "--iterations=10", "--save_steps=0"]


def last_json(folder):
    with open(os.path.join(folder, "eval_results.json")) as f:
        return json.load(f)


@pytest.mark.slow
def test_a_run_starts_from_another_runs_weights_far_below_a_run_from_scratch(tmp_path):
    corpus = write_corpus(str(tmp_path / "notes.txt"))
    source = run(TRAIN + ["--config=tiny", "--dataset=text", f"--text={corpus}", "--level=word",
                          "--model_dir=source", "--train_steps=60", "--tgt_len=8", "--mem_len=8", *COMMON],
                 cwd=tmp_path)
    assert source.returncode == 0, source.stderr[-3000:]
    assert "bpc" not in source.stdout and "ppl" in source.stdout  # word level: perplexity
    scratch, trained = last_json(tmp_path / "source")["before"], last_json(tmp_path / "source")["after"]

    tuned = run(TRAIN + ["--init_from=source", "--dataset=text", f"--text={corpus}", "--model_dir=tuned",
                         "--train_steps=10", "--dropout=0.0", *COMMON], cwd=tmp_path)
    assert tuned.returncode == 0, tuned.stderr[-3000:]
    results = last_json(tmp_path / "tuned")
    assert results["before"]["loss"] == pytest.approx(trained["loss"], rel=1e-5)  # the source's validation loss
    assert results["before"]["loss"] < 0.7 * scratch["loss"]
    with open(tmp_path / "tuned" / "init_from.json") as f:
        origin = json.load(f)
    assert origin["init_from"] == "source" and origin["kind"] == "run folder"
    assert os.path.exists(tmp_path / "data" / "text-source" / "vocab.json")  # records in the source's vocabulary

    # a --config beside it, or records of another vocabulary: one line, nothing of the new run written
    other = run(TRAIN + ["--init_from=source", "--model_dir=refused", "--config=tiny"], cwd=tmp_path)
    assert other.returncode == 1 and other.stderr.count("\n") == 1 and "drop --config" in other.stderr
    chars = run([sys.executable, "-m", "tf_records", "--dataset=text", f"--text={corpus}", "--level=char",
                 "--records_dir=data/chars", "--tgt_len=8", "--per_host_train_bsz=4", "--per_host_valid_bsz=4"],
                cwd=tmp_path)
    assert chars.returncode == 0, chars.stderr[-3000:]
    before = snapshot(str(tmp_path / "data"))
    refused = run(TRAIN + ["--init_from=source", "--data_dir=data/chars", "--model_dir=refused", *COMMON],
                  cwd=tmp_path)
    assert refused.returncode == 1 and refused.stderr.startswith("error: ") and "vocabulary" in refused.stderr
    assert refused.stderr.count("\n") == 1 and not os.path.exists(tmp_path / "refused")
    assert snapshot(str(tmp_path / "data")) == before

    # a preset folder saved by the text task starts a run the same way
    script = ("from txl_keras import TransformerXLCausalLM as T; "
              "T.from_preset('source').save_to_preset('saved')")
    saved = run([sys.executable, "-c", script], cwd=tmp_path)
    assert saved.returncode == 0, saved.stderr[-3000:]
    from_preset = run(TRAIN + ["--init_from=saved", "--dataset=text", f"--text={corpus}", "--model_dir=from_preset",
                               "--train_steps=10", "--dropout=0.0", *COMMON], cwd=tmp_path)
    assert from_preset.returncode == 0, from_preset.stderr[-3000:]
    assert last_json(tmp_path / "from_preset")["before"]["loss"] == pytest.approx(trained["loss"], rel=1e-5)

    # a preset with LoRA adapters: the trainers start from plain weights, so it is refused in one line
    script = ("from txl_keras import TransformerXLCausalLM as T; lm = T.from_preset('source'); "
              "lm.model.enable_lora(2); lm.save_to_preset('adapted')")
    adapted = run([sys.executable, "-c", script], cwd=tmp_path)
    assert adapted.returncode == 0, adapted.stderr[-3000:]
    refused = run(TRAIN + ["--init_from=adapted", "--dataset=text", f"--text={corpus}", "--model_dir=refused",
                           *COMMON], cwd=tmp_path)
    assert refused.returncode == 1 and refused.stderr.count("\n") == 1, refused.stderr[-3000:]
    assert "holds LoRA adapters (rank 2)" in refused.stderr and "merge_lora_weights()" in refused.stderr
    assert not os.path.exists(tmp_path / "refused")
