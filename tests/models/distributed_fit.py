"""Run by test_distribution.py in a process of its own, on JAX with 8 virtual CPU devices:
the text task's `fit` unsharded, data parallel on 8 devices, and 2-way data by 4-way model
parallel with `TransformerXLLM.get_layout_map`; prints each run's per-step losses and how the
sharded weights are laid out, and an int8 model's outputs and layouts unsharded and model
parallel, as JSON."""

import json
import sys

import keras
import numpy as np

from tf_records.vocabulary import Vocabulary
from txl_keras import (TransformerXLCausalLM, TransformerXLCausalLMPreprocessor, TransformerXLConfig,
                       TransformerXLLM, TransformerXLTokenizer)

TEXT = "".join(f"ROMEO: line {i} of the play, said the other one.\nJULIET: {i * 7} to {i % 5}\n" for i in range(30))
VOCAB = Vocabulary(sorted(set(TEXT)), level="char")
CONFIG = TransformerXLConfig.from_preset("tiny", n_token=len(VOCAB), cutoffs=[], tgt_len=8, mem_len=8, dropout=0.0)


class Losses(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.values = []

    def on_train_batch_end(self, batch, logs=None):
        self.values.append(float(logs["loss"]))


def train(distribution):
    keras.distribution.set_distribution(distribution)
    keras.utils.set_random_seed(0)
    model = TransformerXLLM(CONFIG)
    rng = np.random.default_rng(0)
    model.set_weights([rng.normal(0, 0.3, w.shape).astype("float32") for w in model.get_weights()])
    lm = TransformerXLCausalLM(model, TransformerXLCausalLMPreprocessor(TransformerXLTokenizer(VOCAB), 8))
    lm.compile(optimizer=keras.optimizers.Adam(1e-2))
    losses = Losses()
    lm.fit(TEXT, batch_size=8, epochs=2, verbose=0, callbacks=[losses])
    kernel = model.backbone.blocks[0].attention.qkv_kernel
    return {"losses": losses.values,
            "qkv_spec": [str(axis) for axis in getattr(kernel.value.sharding, "spec", ())],
            "qkv_shard_shapes": sorted({tuple(s.data.shape) for s in kernel.value.addressable_shards}),
            "devices": len(kernel.value.sharding.device_set)}


devices = keras.distribution.list_devices()
assert len(devices) == 8, devices
mesh = keras.distribution.DeviceMesh((2, 4), ("batch", "model"), devices)
layout_map = TransformerXLLM.get_layout_map(mesh, config=CONFIG)
results = {"single": train(None),
           "data_parallel": train(keras.distribution.DataParallel(devices=devices)),
           "model_parallel": train(keras.distribution.ModelParallel(layout_map=layout_map, batch_dim_name="batch"))}


def int8_outputs(distribution, weights, tokens):
    """The NLL of an int8 model built under `distribution` with `weights`, and its layouts."""
    keras.distribution.set_distribution(distribution)
    model = TransformerXLLM(CONFIG, quantization="int8")
    model.set_weights(weights)
    attention = model.backbone.blocks[0].attention
    specs = {name: [str(axis) for axis in getattr(getattr(attention, name).value.sharding, "spec", ())]
             for name in ("qkv_kernel", "qkv_kernel_scale", "o_kernel", "o_kernel_scale")}
    return np.asarray(model(tokens, targets=tokens)["nll"]).tolist(), specs


# int8 weights under model parallelism: laid out by their own (transposed) shapes, computing
# what one device computes
keras.distribution.set_distribution(None)
quantized = TransformerXLLM(CONFIG)
quantized.set_weights([np.random.default_rng(1).normal(0, 0.3, w.shape).astype("float32")
                       for w in quantized.get_weights()])
quantized.quantize("int8")
tokens = np.random.default_rng(2).integers(0, len(VOCAB), (2, 8)).astype("int32")
int8_map = TransformerXLLM.get_layout_map(mesh, config=CONFIG, quantization="int8")
results["int8"] = {name: int8_outputs(distribution, quantized.get_weights(), tokens) for name, distribution in (
    ("single", None), ("model_parallel", keras.distribution.ModelParallel(layout_map=int8_map,
                                                                          batch_dim_name="batch")))}
json.dump(results, sys.stdout)
