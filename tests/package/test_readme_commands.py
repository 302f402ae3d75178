"""The README's command lines, run exactly as written (extracted from README.md), on tiny
stand-ins of the files they name: an original TF checkpoint with its `cache.pkl`, raw
WikiText-103 files, a trained run folder."""

import os
import re
import shlex
import subprocess
import sys

import numpy as np
import pytest

from original_formats import CASES, tf_arrays, write_cache_pkl, write_tf_checkpoint

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
pytestmark = pytest.mark.slow


def readme_commands(section):
    """The indented command lines of a README section, continuation lines joined."""
    text = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    body = text.split(section, 1)[1].split("\n#", 1)[0]
    commands, current = [], ""
    for line in body.splitlines():
        if not line.startswith("    "):
            continue
        current += " " + line.strip().split("  #")[0].rstrip("\\").strip()
        if not line.rstrip().endswith("\\"):
            commands.append(current.strip())
            current = ""
    return commands


def env():
    out = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
    out.update(TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return out


def execute(command, cwd, timeout=300):
    """Run a README line in `cwd` (a stand-in for the repository root: its scripts are linked)."""
    for script in ("train_gpu.py", "train_tpu.py"):
        if not os.path.exists(os.path.join(cwd, script)):
            os.symlink(os.path.join(ROOT, script), os.path.join(cwd, script))
    argv = shlex.split(command)
    if argv[0] == "python":
        argv[0] = sys.executable
    result = subprocess.run(["timeout", "-k", "10", str(timeout)] + argv, cwd=cwd, capture_output=True,
                            text=True, env=env())
    assert result.returncode == 0, f"{command}\n{result.stderr[-3000:]}"
    return result


WORDS = ["<eos>", "the", "of", "and", "in", "to", "a", "was", "history", "The", "is", "on", "for", "as", "with",
         "by", "at", "he", "from", "that", "his", "it", "an", "were", "are", "which", "be", "this", "<unk>", "or"]


def test_pretrained_weights_commands(tmp_path):
    """Convert an original TF checkpoint and its cache.pkl, build the test records with its
    vocabulary, evaluate with the paper's memory settings, generate until <eos>."""
    commands = readme_commands("### The original pretrained weights")
    assert [c.split()[:3] for c in commands] == [
        ["bash", "sota/download.sh"], ["python", "-m", "txl_keras.convert"], ["python", "-m", "tf_records"],
        ["python", "train_gpu.py", "--do_train=false"], ["python", "-m", "txl_keras.generate"]]
    n_token, cutoffs, div_val, d_embed, untie_r, share, same_dim = CASES["wt103"]
    assert n_token == len(WORDS)
    arrays, _ = tf_arrays(np.random.default_rng(0), *CASES["wt103"])
    arrays["transformer/adaptive_softmax/cutoff_0/b"][0] = 60.0  # the model always says <eos>
    source = tmp_path / "pretrained_xl" / "tf_wt103"
    (source / "model").mkdir(parents=True)
    (source / "data").mkdir()
    write_tf_checkpoint(str(source / "model" / "model.ckpt-0"), arrays)
    write_cache_pkl(str(source / "data" / "cache.pkl"), WORDS, unk="<unk>", dataset="wt103")
    raw = tmp_path / "raw" / "wt103"
    raw.mkdir(parents=True)
    rng = np.random.default_rng(1)
    for split in ("train", "valid", "test"):
        lines = [" ".join(rng.choice(WORDS[1:28], 12)) for _ in range(40)]
        (raw / f"wiki.{split}.tokens").write_text("\n".join(lines) + "\n")
    for command in commands[1:4]:
        result = execute(command, str(tmp_path))
    line = [l for l in result.stdout.splitlines() if l.startswith("eval test:")][-1]
    assert "tokens 519 of 519" in line  # every token but the first, once (40 lines of 12 words + <eos>)
    out = execute(commands[4], str(tmp_path)).stdout.strip().splitlines()[-1]
    assert out == "The history of <eos>"  # printing ends at the stop symbol


def test_using_trained_models_commands(tmp_path):
    """Export and generate from a run folder where the README puts it; load the export
    in a Python that has no txl_keras."""
    commands = readme_commands("## Using trained models")
    assert [c.split()[:3] for c in commands] == [["python", "-m", "txl_keras.export"],
                                                 ["python", "-m", "txl_keras.generate"]]
    from tf_records import build_records

    # a tiny byte-level run where the quickstart leaves its run folder
    (tmp_path / "source.py").write_text("def main(argv):\n    return len(argv)\n" * 200)
    records = build_records("text", str(tmp_path / "records"), text=str(tmp_path / "source.py"), level="byte",
                            splits=["train", "valid"], tgt_len=8, per_host_train_bsz=4, per_host_valid_bsz=4,
                            log=lambda *_: None)
    execute(f"python train_gpu.py --config=tiny --data_dir={records} --model_dir=runs/quickstart --tgt_len=8 "
            "--mem_len=8 --train_batch_size=4 --eval_batch_size=4 --train_steps=4 --iterations=2 --do_eval=false",
            str(tmp_path))
    for command in commands:
        result = execute(command, str(tmp_path))
    assert result.stdout.strip().startswith("def main(")
    output = re.search(r"--output=(\S+)", commands[0]).group(1)
    probe = ("import sys, tensorflow as tf\n"
             f"m = tf.saved_model.load({output!r})\n"
             "s = m.initial_memory(tf.constant(1))\n"
             "n = sum(k.startswith('mem_') for k in s)\n"
             "out = m.next_log_probs(tf.constant([[1, 2]]), s['memory_valid'], *[s[f'mem_{i}'] for i in range(n)])\n"
             "assert 'txl_keras' not in sys.modules\n"
             "print(float(tf.reduce_logsumexp(out['log_probs'], -1)[0]))\n")
    clean = {k: v for k, v in env().items() if k != "PYTHONPATH"}
    loaded = subprocess.run([sys.executable, "-c", probe], cwd=str(tmp_path), capture_output=True, text=True,
                            env=clean, timeout=120)
    assert loaded.returncode == 0, loaded.stderr[-2000:]
    assert abs(float(loaded.stdout.strip().splitlines()[-1])) < 1e-4  # probabilities sum to one
