"""The matrix products of a wt103 evaluation segment at batch 1, timed on each engine
side by side: TensorFlow's XLA:CPU (what our evaluation's blocks compile to), TensorFlow's
graph kernels (oneDNN, our training step and adaptive softmax) and PyTorch (MKL, the
Hugging Face port's and the original code's).

    python bench/gemm_engines.py --hf_python=/path/to/python-with-torch

Each product is timed alone (float32, 2 threads, a fresh process per engine): `LOOP`
products run in one call, each depending on the last and followed by the sum of its
result (on every engine), and the time of a call with one product is taken off, so that
no engine pays for its call (a TensorFlow function's call costs ~0.4 ms, more than a
128-row product takes; timed per call, the 128-row products looked 2-3x slower on
TensorFlow than on PyTorch). The products of one segment's 16 blocks are then weighted
into one rate per engine: ours (queries, keys and values of the segment's 128 rows only;
the position keys and the memory's keys and values kept) and the port's (keys and values
of all 1,728 rows and the position projection every segment). Inside a compiled program
XLA also runs independent products side by side, so these rates compare the engines;
they bound neither run.
"""

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import emit, run_worker  # noqa: E402

T, K, WIDTH, D, H, DH, INNER, LAYERS = 128, 1728, 1129, 410, 10, 41, 2100, 16
# name: (batch, m, k, n); the batched ones are per head
PRODUCTS = {
    "queries (128 rows)": (1, T, D, D),
    "keys, values (128 rows)": (1, T, D, 2 * D),
    "output projection": (1, T, D, D),
    "feed-forward in": (1, T, D, INNER),
    "feed-forward out": (1, T, INNER, D),
    "content scores": (H, T, DH, K),
    "position scores (clamped, 1,129 columns)": (H, T, DH, WIDTH),
    "position scores (all 1,728 columns)": (H, T, DH, K),
    "probabilities x values": (H, T, K, DH),
    "queries, keys, values (1,728 rows)": (1, K, D, 3 * D),
    "position projection (1,728 rows)": (1, K, D, D),
}
OURS = ["queries (128 rows)", "keys, values (128 rows)", "output projection", "feed-forward in",
        "feed-forward out", "content scores", "position scores (clamped, 1,129 columns)", "probabilities x values"]
PORT = ["queries, keys, values (1,728 rows)", "position projection (1,728 rows)", "output projection",
        "feed-forward in", "feed-forward out", "content scores", "position scores (all 1,728 columns)",
        "probabilities x values"]
ENGINES = ("xla", "tf_graph", "torch")
LOOP = 10  # products timed per call


def flops(name):
    batch, m, k, n = PRODUCTS[name]
    return 2 * batch * m * k * n


def best_ms(call, repeats):
    call()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return min(times) * 1e3


def tf_worker(jit, repeats):
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(2)
    tf.config.threading.set_inter_op_parallelism_threads(2)

    def products(a, b, count):
        # `count` products in one program, each depending on the last (so that none is
        # hoisted out of the loop or run side by side with another), then one scalar back
        def body(i, carry):
            return i + 1, carry + tf.reduce_sum(tf.matmul(a + carry * 0.0, b))

        return tf.while_loop(lambda i, _: i < count, body, (tf.constant(0), tf.constant(0.0)))[1]

    run = tf.function(products, jit_compile=jit)
    result = {}
    for name, (batch, m, k, n) in PRODUCTS.items():
        lead = (batch,) if batch > 1 else ()
        a, b = tf.random.normal(lead + (m, k)), tf.random.normal(lead + (k, n))
        one = best_ms(lambda: run(a, b, tf.constant(1)).numpy(), repeats)
        many = best_ms(lambda: run(a, b, tf.constant(1 + LOOP)).numpy(), repeats)
        result[name] = (many - one) / LOOP
    return result


def torch_worker(repeats):
    import torch

    torch.set_num_threads(2)
    result = {}
    with torch.no_grad():
        for name, (batch, m, k, n) in PRODUCTS.items():
            lead = (batch,) if batch > 1 else ()
            a, b = torch.randn(*lead, m, k), torch.randn(*lead, k, n)

            def run(count):
                carry = torch.zeros(())
                for _ in range(count):
                    carry = carry + torch.matmul(a + carry * 0.0, b).sum()
                return float(carry)

            one = best_ms(lambda: run(1), repeats)
            result[name] = (best_ms(lambda: run(1 + LOOP), repeats) - one) / LOOP
    return result


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--engine", choices=ENGINES, help="run one worker (internal)")
    parser.add_argument("--hf_python", default=None, help="a Python with torch, for the PyTorch column")
    parser.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args()
    if args.engine == "torch":
        return emit(torch_worker(args.repeats))
    if args.engine:
        return emit(tf_worker(args.engine == "xla", args.repeats))
    print(f"command: python bench/{os.path.basename(__file__)} " + " ".join(sys.argv[1:]))
    worker = ["--repeats", str(args.repeats)]
    times = {engine: run_worker(sys.executable, __file__, ["--engine", engine] + worker) for engine in ENGINES[:2]}
    if args.hf_python:
        times["torch"] = run_worker(args.hf_python, __file__, ["--engine", "torch"] + worker)
    print("GFLOP/s per product (float32, 2 threads):")
    print(f"{'product':>42} {'(batch, m, k, n)':>24} " + " ".join(f"{e:>9}" for e in times))
    for name, shape in PRODUCTS.items():
        rates = " ".join(f"{flops(name) / times[e][name] / 1e6:9.1f}" for e in times)
        print(f"{name:>42} {str(shape):>24} {rates}")
    for label, names in (("ours", OURS), ("the port's", PORT)):
        total = sum(map(flops, names)) * LAYERS
        rates = ", ".join(f"{e} {total / (sum(times[e][n] for n in names) * LAYERS) / 1e6:.0f}" for e in times)
        print(f"{label} products of one segment ({LAYERS} blocks, {total / 1e9:.1f} GFLOP), GFLOP/s: {rates}")
    print(f"FLOP ratio, the port's to ours: {sum(map(flops, PORT)) / sum(map(flops, OURS)):.2f}x")


if __name__ == "__main__":
    main()
