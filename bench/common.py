"""Shared pieces of the benchmark scripts: configs, FLOP counts, synthetic records,
the fp32 matmul ceiling, and running workers side by side."""

import json
import os
import resource
import subprocess
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from txl_keras.models import flops  # noqa: E402
from txl_keras.models.config import PRESETS, TransformerXLConfig  # noqa: E402

# The reference's char-small config (the package's preset), and a word-level one with
# adaptive input/softmax; `batch` is the benchmark's per-step batch.
CONFIGS = {
    "char_small": {**PRESETS["char_small"], "batch": 16, "cutoffs": [], "div_val": 1},
    "word_adaptive": dict(n_token=32000, n_layer=6, d_model=256, n_head=8, d_head=32, d_inner=1024,
                          tgt_len=64, mem_len=64, batch=16, cutoffs=[2000, 8000], div_val=2),
}


def model_config(c, **changes):
    """The TransformerXLConfig of a benchmark config dict."""
    return TransformerXLConfig(**{**{k: v for k, v in c.items() if k != "batch"}, **changes})


def model_flops_per_token(c, training=True, mem_len=None, tgt_len=None):
    """The package's count (txl_keras.models.flops) for a benchmark config dict."""
    return flops.model_flops_per_token(model_config(c), training, mem_len, tgt_len)


def matmul_ceiling_gflops(sizes=(1024, 2048), repeats=8):
    """Best fp32 matmul rate of this process's TensorFlow over square sizes, GFLOP/s."""
    import tensorflow as tf

    f = tf.function(lambda a, b: tf.linalg.matmul(a, b))
    best = 0.0
    for size in sizes:
        a = tf.random.normal([size, size])
        b = tf.random.normal([size, size])
        f(a, b).numpy()
        for _ in range(repeats):
            start = time.perf_counter()
            f(a, b).numpy()
            best = max(best, 2 * size**3 / (time.perf_counter() - start) / 1e9)
    return best


def peak_rss_mb():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def current_rss_mb():
    """Resident memory now (after importing the framework: its fixed cost)."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS")) / 1024


def emit(result):
    print("RESULT " + json.dumps(result), flush=True)


def run_worker(python, script, args, env=None):
    """Run one measurement in a fresh process; returns its RESULT dict."""
    out = subprocess.run([python, script] + args, capture_output=True, text=True,
                         env={**os.environ, **(env or {})}, timeout=3600)
    for line in out.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    raise RuntimeError(f"{python} {script} {' '.join(args)} failed:\n{out.stderr[-3000:]}")


def random_ids(n, vocab, seed=0):
    return np.random.default_rng(seed).integers(0, vocab, n).astype(np.int32)
