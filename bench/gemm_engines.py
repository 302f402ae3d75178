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
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import emit, run_worker  # noqa: E402

OURS = ["queries, keys, values (128 rows)", "output projection", "feed-forward in",
        "feed-forward out", "content scores", "position scores (clamped)", "probabilities x values"]
PORT = ["queries, keys, values (all rows)", "position projection (all rows)", "output projection",
        "feed-forward in", "feed-forward out", "content scores", "position scores (all columns)",
        "probabilities x values"]
ENGINES = ("xla", "tf_graph", "torch")
LOOP = 10  # products timed per call


def segment_products():
    """`(products, layers)`: each product of one block at the paper's wt103 evaluation
    (`eval_throughput.EVAL_WT103`) at batch 1, name -> `(batch, m, k, n)` (the batched
    ones per head), from the `wt103_base` preset."""
    from eval_throughput import EVAL_WT103
    from txl_keras.models.config import TransformerXLConfig

    c = TransformerXLConfig.from_preset("wt103_base")
    t, d, heads, dh = EVAL_WT103["tgt_len"], c.d_model, c.n_head, c.d_head
    keys = EVAL_WT103["mem_len"] + t
    # the position product's columns with clamping: the last clamp_len + T keys and a spare
    clamped = min(keys, EVAL_WT103["clamp_len"] + t) + 1
    products = {
        "queries, keys, values (128 rows)": (1, t, d, 3 * heads * dh),  # one product (project_qkv)
        "output projection": (1, t, heads * dh, d),
        "feed-forward in": (1, t, d, c.d_inner),
        "feed-forward out": (1, t, c.d_inner, d),
        "content scores": (heads, t, dh, keys),
        "position scores (clamped)": (heads, t, dh, clamped),
        "position scores (all columns)": (heads, t, dh, keys),
        "probabilities x values": (heads, t, keys, dh),
        "queries, keys, values (all rows)": (1, keys, d, 3 * heads * dh),
        "position projection (all rows)": (1, keys, d, heads * dh),
    }
    return products, c.n_layer


def flops(shape):
    batch, m, k, n = shape
    return 2 * batch * m * k * n


def best_ms(call, repeats):
    call()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return min(times) * 1e3


def per_product_ms(run, repeats):
    """Milliseconds per product of `run(count)` (`count` dependent products in one call),
    the call's own cost taken off."""
    return (best_ms(lambda: run(1 + LOOP), repeats) - best_ms(lambda: run(1), repeats)) / LOOP


def tf_dependent_products(product, jit):
    """A TensorFlow function `(a, b, count)` -> scalar: `count` products `product(a, b)` in
    one program, each depending on the last (so that none is hoisted out of the loop or run
    side by side with another), then one scalar back; XLA-compiled if `jit`."""
    import tensorflow as tf

    def dependent_products(a, b, count):
        def body(i, carry):
            return i + 1, carry + tf.reduce_sum(product(a + carry * 0.0, b))

        return tf.while_loop(lambda i, _: i < count, body, (tf.constant(0), tf.constant(0.0)))[1]

    return tf.function(dependent_products, jit_compile=jit)


def tf_worker(products, jit, repeats):
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(2)
    tf.config.threading.set_inter_op_parallelism_threads(2)
    looped = tf_dependent_products(tf.matmul, jit)
    result = {}
    for name, (batch, m, k, n) in products.items():
        lead = (batch,) if batch > 1 else ()
        a, b = tf.random.normal(lead + (m, k)), tf.random.normal(lead + (k, n))
        result[name] = per_product_ms(lambda count: looped(a, b, tf.constant(count)).numpy(), repeats)
    return result


def torch_worker(products, repeats):
    import torch

    torch.set_num_threads(2)
    result = {}
    with torch.no_grad():
        for name, (batch, m, k, n) in products.items():
            lead = (batch,) if batch > 1 else ()
            a, b = torch.randn(*lead, m, k), torch.randn(*lead, k, n)

            def dependent_products(count):
                carry = torch.zeros(())
                for _ in range(count):
                    carry = carry + torch.matmul(a + carry * 0.0, b).sum()
                return float(carry)

            result[name] = per_product_ms(dependent_products, repeats)
    return result


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--engine", choices=ENGINES, help="run one worker (internal)")
    parser.add_argument("--hf_python", default=None, help="a Python with torch, for the PyTorch column")
    parser.add_argument("--repeats", type=int, default=10, help="calls per timing, the best kept")
    parser.add_argument("--products_json", help="the products (internal: main process -> workers)")
    args = parser.parse_args()
    if args.repeats < 1:
        parser.error(f"--repeats must be at least 1, got {args.repeats}")
    if args.engine:
        products = {name: tuple(shape) for name, shape in json.loads(args.products_json).items()}
        if args.engine == "torch":
            return emit(torch_worker(products, args.repeats))
        return emit(tf_worker(products, args.engine == "xla", args.repeats))
    print(f"command: python bench/{os.path.basename(__file__)} " + " ".join(sys.argv[1:]))
    products, layers = segment_products()
    worker = ["--repeats", str(args.repeats), "--products_json", json.dumps(products)]
    times = {engine: run_worker(sys.executable, __file__, ["--engine", engine] + worker) for engine in ENGINES[:2]}
    if args.hf_python:
        times["torch"] = run_worker(args.hf_python, __file__, ["--engine", "torch"] + worker)
    print("GFLOP/s per product (float32, 2 threads):")
    print(f"{'product':>34} {'(batch, m, k, n)':>24} " + " ".join(f"{e:>9}" for e in times))
    for name, shape in products.items():
        rates = " ".join(f"{flops(shape) / times[e][name] / 1e6:9.1f}" for e in times)
        print(f"{name:>34} {str(shape):>24} {rates}")
    segment = {}  # label -> the GFLOP of one segment's products
    for label, names in (("ours", OURS), ("the port's", PORT)):
        segment[label] = sum(flops(products[n]) for n in names) * layers
        rates = ", ".join(f"{e} {segment[label] / (sum(times[e][n] for n in names) * layers) / 1e6:.0f}" for e in times)
        print(f"{label} products of one segment ({layers} blocks, {segment[label] / 1e9:.1f} GFLOP), GFLOP/s: {rates}")
    ratio = segment["the port's"] / segment["ours"]
    print(f"FLOP ratio, the port's to ours: {ratio:.2f}x")


if __name__ == "__main__":
    main()
