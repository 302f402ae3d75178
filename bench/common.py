"""Shared pieces of the benchmark scripts: configs, FLOP counts, synthetic records,
the fp32 matmul ceiling, and running workers side by side."""

import json
import os
import resource
import statistics
import subprocess
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The checkout whose packages a worker imports: this one, or the one in TXL_BENCH_PACKAGES (a
# baseline measured by this checkout's script, where the baseline's own script lacks a mode).
sys.path.insert(0, os.environ.get("TXL_BENCH_PACKAGES", ROOT))

from txl_io.cpu_allocator import prefer_bfc_cpu_allocator  # noqa: E402

prefer_bfc_cpu_allocator()  # as the programs start: this process and every worker it runs

CONFIG_NAMES = ("char_small", "word_adaptive", "word_50k")


def configs():
    """The benchmark configs: the reference's char-small (the package's preset), and
    word-level ones with adaptive input/softmax; `batch` is the per-step batch. Imports
    the package (the main process passes a config to its workers as JSON, so a worker of
    another framework needs neither txl_keras nor Keras)."""
    from txl_keras.models.config import PRESETS

    return {
        "char_small": {**PRESETS["char_small"], "batch": 16, "cutoffs": [], "div_val": 1},
        "word_adaptive": dict(n_token=32000, n_layer=6, d_model=256, n_head=8, d_head=32, d_inner=1024,
                              tgt_len=64, mem_len=64, batch=16, cutoffs=[2000, 8000], div_val=2),
        # the word-level model of the performance targets: 50k words, three tail clusters, div_val 4,
        # tail projections shared with the input (the wt103 setting), tgt/mem 128
        "word_50k": dict(n_token=50000, n_layer=4, d_model=256, n_head=8, d_head=32, d_inner=1024,
                         tgt_len=128, mem_len=128, batch=16, cutoffs=[2000, 10000, 20000], div_val=4,
                         proj_share_all_but_first=True),
    }


def model_config(c, **changes):
    """The TransformerXLConfig of a benchmark config dict."""
    from txl_keras.models.config import TransformerXLConfig

    return TransformerXLConfig(**{**{k: v for k, v in c.items() if k != "batch"}, **changes})


def model_flops_per_token(c, training=True, mem_len=None, tgt_len=None, shares=None):
    """The package's count (txl_keras.models.flops) for a benchmark config dict; `shares`
    (from `cluster_shares`) weights the tail clusters by the data's token frequencies."""
    from txl_keras.models import flops

    tails = shares[1:] if shares else None
    return flops.model_flops_per_token(model_config(c), training, mem_len, tgt_len, cluster_shares=tails)


def generation_counts(c, memory, rows=1):
    """`(model FLOPs, float32 bytes read)` per new token of generation with `memory` rows of
    memory attended, for a benchmark config dict. FLOPs: the package's forward count at one
    query, with every cluster of an adaptive softmax (generation needs the whole
    distribution). Bytes: each weight a step multiplies by (the position projection is made
    once per call), every softmax cluster, and per row the memory's keys and values and the
    position keys of its distances. With `rows` rows, the weights are read once per step."""
    from txl_keras.models import flops

    config = model_config(c)
    d, layers, inner = config.d_model, config.n_layer, config.n_head * config.d_head
    every_cluster = [1.0] * len(config.cutoffs)
    flop = flops.model_flops_per_token(config, training=False, mem_len=memory, tgt_len=1,
                                       cluster_shares=every_cluster or None)
    weights = layers * (4 * d * inner + 2 * d * config.d_inner + config.d_inner + 5 * d) \
        + flops.softmax_macs_per_token(config, every_cluster or None)
    distances = memory + 1 if config.clamp_len <= 0 else min(memory + 1, config.clamp_len + 1)
    per_row = layers * inner * (2 * memory + distances)
    return flop, 4.0 * (weights / rows + per_row)


def read_bandwidth_gbs(megabytes=256, repeats=8):
    """Best rate at which this process's TensorFlow sums a float32 array far larger than the
    caches, GB/s: the memory bandwidth a step that streams its weights can reach."""
    import tensorflow as tf

    x = tf.random.normal([megabytes * 2**20 // 4])
    f = tf.function(tf.reduce_sum)
    f(x).numpy()
    best = 0.0
    for _ in range(repeats):
        start = time.perf_counter()
        f(x).numpy()
        best = max(best, x.shape[0] * 4 / (time.perf_counter() - start) / 1e9)
    return best


def matmul_ceiling_gflops(sizes=(1024, 2048), repeats=8, dtype="float32"):
    """Best matmul rate of this process's TensorFlow over square sizes, GFLOP/s, in
    `dtype` (float32, or bfloat16: what mixed_bfloat16's products can reach)."""
    import tensorflow as tf

    f = tf.function(lambda a, b: tf.linalg.matmul(a, b))
    best = 0.0
    for size in sizes:
        a = tf.cast(tf.random.normal([size, size]), dtype)
        b = tf.cast(tf.random.normal([size, size]), dtype)
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


def run_rounds(rounds, workers):
    """Run each `(name, run)` of `workers` once per round, in the given order in even rounds
    and reversed in odd ones, so that a drift of the machine's speed during a run (this
    project's VMs sped up by 10-25% over some runs) falls on every side alike instead of
    always on the first; returns `{name: [run() of each round]}`."""
    results = {name: [] for name, _ in workers}
    for index in range(rounds):
        for name, run in workers if index % 2 == 0 else workers[::-1]:
            results[name].append(run())
    return results


def ratio_line(impl, ours, theirs):
    """The ratio of our tokens/s to `impl`'s: best of each, and round by round (the
    workers of one round run one after the other, so a slow phase of the machine affects
    both sides of a round more alike than the best of each; `run_rounds` alternates their
    order). `ours`, `theirs`: tokens/s per round."""
    paired = [a / b for a, b in zip(ours, theirs)]
    rounds = ""
    if len(paired) > 1:
        rounds = f"; round by round {', '.join(f'{x:.2f}x' for x in paired)}, median {statistics.median(paired):.2f}x"
    return f"ratio txl_keras / {impl}: {max(ours) / max(theirs):.2f}x (best of each{rounds})"


def random_ids(n, vocab, seed=0, zipf=False):
    """`n` token ids: uniform, or Zipf-like (p(id) proportional to 1 / (id + 1), ids in
    frequency order as in a real vocabulary: most tokens fall in the head cluster)."""
    rng = np.random.default_rng(seed)
    if not zipf:
        return rng.integers(0, vocab, n).astype(np.int32)
    p = 1.0 / np.arange(1, vocab + 1)
    return rng.choice(vocab, size=n, p=p / p.sum()).astype(np.int32)


def cluster_shares(ids, cutoffs, vocab):
    """The fraction of `ids` in each cluster of the adaptive softmax."""
    bounds = [0] + list(cutoffs) + [vocab]
    return [float(np.mean((ids >= a) & (ids < b))) for a, b in zip(bounds, bounds[1:])]
