"""Low-rank adaptation (LoRA, Hu et al. 2021) of a layer's kernels, as Keras's `Dense.enable_lora`
does it: a frozen kernel `W (in, out)` is used as `W + (alpha / rank) * A @ B`, with `A (in, rank)`
drawn from `a_initializer` and `B (rank, out)` zero, so a fresh adapter changes nothing. The
adapters are float32 (fine-tuning steps are small); the sum is cast to the layer's compute dtype."""

import keras
from keras import ops

from txl_keras.layers import arguments


def check_rank(layer, rank, lora_alpha, kernel_shapes):
    """`(rank, alpha)` checked: an integer in [1, the smallest side of every kernel], and
    `lora_alpha` None (= rank) or a positive number."""
    largest = min(min(shape) for shape in kernel_shapes)
    rank = arguments.int_in_range(layer, "rank", rank, 1, largest,
                                  f"an integer in [1, {largest}] (the smallest side of the adapted projections)")
    alpha = rank if lora_alpha is None else arguments.positive_float(layer, "lora_alpha", lora_alpha)
    return rank, alpha


def add_adapter(layer, name, kernel, rank, a_initializer="he_uniform", b_initializer="zeros"):
    """`(A, B)` of `kernel`, added to `layer` as `{name}_lora_a` and `{name}_lora_b`."""
    a = layer.add_weight(name=f"{name}_lora_a", shape=(kernel.shape[0], rank),
                         initializer=keras.initializers.get(a_initializer), dtype="float32")
    b = layer.add_weight(name=f"{name}_lora_b", shape=(rank, kernel.shape[1]),
                         initializer=keras.initializers.get(b_initializer), dtype="float32")
    return a, b


def adapted(kernel, adapter, scale, dtype):
    """`kernel + scale * A @ B` in `dtype` (`kernel` itself without an adapter)."""
    if adapter is None:
        return kernel
    a, b = adapter
    return ops.cast(ops.cast(kernel, "float32") + scale * ops.matmul(a, b), dtype)
