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

# The reference's char-small config, and a word-level one with adaptive input/softmax.
CONFIGS = {
    "char_small": dict(n_token=204, n_layer=6, d_model=256, n_head=8, d_head=32, d_inner=1024,
                       tgt_len=128, mem_len=128, batch=16, cutoffs=[], div_val=1),
    "word_adaptive": dict(n_token=32000, n_layer=6, d_model=256, n_head=8, d_head=32, d_inner=1024,
                          tgt_len=64, mem_len=64, batch=16, cutoffs=[2000, 8000], div_val=2),
}


def softmax_macs_per_token(c):
    """Multiply-adds of the output layer per token: `d V` for a full softmax; for an adaptive
    one (div_val > 1, a projection per cluster), the head plus each tail weighted by how
    often its tokens occur in the benchmark's uniform random data (size / V)."""
    d, V, cutoffs = c["d_model"], c["n_token"], c["cutoffs"]
    if not cutoffs:
        return d * V
    bounds = [0] + list(cutoffs) + [V]
    macs = 0.0
    for i in range(len(bounds) - 1):
        size, width = bounds[i + 1] - bounds[i], d // c["div_val"] ** i
        columns = size + (len(cutoffs) if i == 0 else 0)
        share = 1.0 if i == 0 else size / V
        macs += share * (d * width + width * columns)
    return macs


def model_flops_per_token(c, training=True, mem_len=None, tgt_len=None):
    """6 N_nonembedding + 6 d V + 18 L d (m + (q + 1) / 2) (training; a third of it for
    a forward pass), the formula of the reference; `d V` becomes the adaptive softmax's
    multiply-adds when there are cutoffs (`softmax_macs_per_token`)."""
    d, L = c["d_model"], c["n_layer"]
    m = c["mem_len"] if mem_len is None else mem_len
    q = c["tgt_len"] if tgt_len is None else tgt_len
    inner = c["n_head"] * c["d_head"]
    n_nonembedding = L * (5 * d * inner + 2 * d * c["d_inner"] + c["d_inner"] + 5 * d)
    flops = 6 * n_nonembedding + 6 * softmax_macs_per_token(c) + 18 * L * d * (m + (q + 1) / 2)
    return flops if training else flops / 3


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
