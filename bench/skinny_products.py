"""How fast this machine's TensorFlow multiplies a few rows by a large weight matrix: the
products of a generation step, which read every weight once per step.

    python bench/skinny_products.py

For each weight shape of `wt103_base` (a layer's projections and feed-forward, the
softmax's head and a tail cluster, float32) and 1 or 8 rows: the rate at which the
product reads the weight (2 threads, products one after another in one call, the call's
own cost taken off, as in `bench/gemm_engines.py`), on the graph kernels and under XLA,
for the softmax's shapes also with the weight in the output table's layout (one product,
or a batch of the table's row pieces, `kernels.tables.chunked_rows_times_table`), next to the
read bandwidth measured in the same process (`common.read_bandwidth_gbs`). A step for 8
rows costs what one row's step costs only when 8 rows read a weight as fast as one row
does.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import read_bandwidth_gbs  # noqa: E402
from gemm_engines import per_product_ms, tf_dependent_products  # noqa: E402

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import tensorflow as tf  # noqa: E402

from txl_keras.kernels.tables import chunked_rows_times_table  # noqa: E402

# (what, rows of W, columns of W)
SHAPES = [("query, key, value projection", 410, 1230), ("feed-forward in", 410, 2100),
          ("feed-forward out", 2100, 410), ("softmax head", 410, 20003), ("softmax tail cluster", 410, 160000)]


# (name, the product of rows x and a weight) for a weight kept as (in, out), as the layers'
# kernels are, and as (out, in), as the adaptive softmax's output tables are (tied to the
# embedding): the plain product and `kernels.tables.rows_times_table`'s forms for few rows
# (one product of the whole table, or a batch of its row pieces)
FORMS = {
    "kernel": [("x @ W", lambda x, w: x @ w)],
    "table": [("x @ T^T", lambda x, t: tf.linalg.matmul(x, t, transpose_b=True)),
              ("(T @ x^T)^T", lambda x, t: tf.transpose(tf.linalg.matmul(t, x, transpose_b=True))),
              ("T in pieces", lambda x, t: chunked_rows_times_table(x, t))],
}


def product_seconds(product, x, w, xla, repeats=10):
    """Seconds per `product(x, w)`, each depending on the last in one program, the call's
    own cost taken off (`gemm_engines`' method)."""
    looped = tf_dependent_products(product, xla)
    return per_product_ms(lambda count: looped(x, w, tf.constant(count)).numpy(), repeats) / 1e3


def main():
    tf.config.threading.set_intra_op_parallelism_threads(2)
    tf.config.threading.set_inter_op_parallelism_threads(2)
    print(f"command: python bench/{os.path.basename(__file__)}")
    print(f"read bandwidth (a sum over 256 MB): {read_bandwidth_gbs():.1f} GB/s; GB/s of the weight read "
          "by each product, graph kernels (oneDNN) / XLA")
    for what, k, n in SHAPES:
        w = tf.random.normal([k, n])
        layouts = {"kernel": w, "table": tf.transpose(w) + 0.0} if n > 10000 else {"kernel": w}
        for layout, weight in layouts.items():
            for form, product in FORMS[layout]:
                rates = []
                for rows in (1, 8):
                    x = tf.random.normal([rows, k])
                    seconds = [product_seconds(product, x, weight, xla) for xla in (False, True)]
                    rates.append(f"{rows} row{'s' if rows > 1 else ''} " + " / ".join(
                        f"{k * n * 4 / t / 1e9:.1f}" for t in seconds))
                print(f"{what:<30} {k} x {n}, {form:<12} " + ", ".join(rates), flush=True)


if __name__ == "__main__":
    main()
