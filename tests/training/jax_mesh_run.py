"""Run by test_jax_trainer.py in a process of its own, on JAX with 8 virtual CPU devices: the
JAX trainer on one device, data parallel on 8 and 2-way data by 4-way model parallel, from the
same weights on the same records; prints each run's per-step losses, final weights and validation
loss, how the model-parallel weights are laid out, whether the replicas' dropout masks differ,
and what the lowered training step holds, as JSON (the numbers are compared by the test)."""

import json
import os
import sys

import jax
import keras
import numpy as np

from helpers import build, summaries
from tf_records import load_corpus_info
from txl_keras import TransformerXLConfig
from txl_keras.models.layout_map import get_layout_map
from txl_keras.training import TrainConfig
from txl_keras.training.jax_route import mesh_devices
from txl_keras.training.jax_trainer import JaxTrainer

tmp = sys.argv[1]
records = build(tmp, batch=16)
CONFIG = TransformerXLConfig.from_preset("tiny", n_token=load_corpus_info(records)["vocab_size"], dropout=0.0,
                                         dropatt=0.0)
devices = np.array(mesh_devices())
assert len(devices) == 8, devices


def trainer(name, distribution, steps=4, **overrides):
    settings = dict(model_dir=os.path.join(tmp, name), records_dir=records, train_batch_size=16, eval_batch_size=16,
                    train_steps=steps, iterations=1, save_steps=0, learning_rate=3e-3, warmup_steps=0,
                    batch_chunk=2)
    settings.update(overrides)
    out = JaxTrainer(distribution, CONFIG, TrainConfig(**settings), log=lambda *_: None)
    rng = np.random.default_rng(0)
    out.model.set_weights([rng.normal(0, 0.3, w.shape).astype("float32") for w in out.model.get_weights()])
    out._started = True  # nothing to resume: these weights
    return out


def train(name, distribution):
    run = trainer(name, distribution)
    run.train()
    losses = summaries(os.path.join(tmp, name, "train"))["loss"]
    return run, {"losses": [losses[s] for s in sorted(losses)],
                 "weights": [w.tolist() for w in run.model.get_weights()],
                 "eval_loss": run.evaluate(progress=False, summaries=False)["loss"]}


results = {}
_, results["single"] = train("single", None)
data_parallel = keras.distribution.DataParallel(device_mesh=keras.distribution.DeviceMesh((8,), ("batch",), devices))
run, results["data_parallel"] = train("data_parallel", data_parallel)
# The lowered step: static shapes, no host callbacks, no float64.
text = run.lowered_train_step().as_text()
results["lowered"] = {"f64": "f64" in text, "callback": "callback" in text, "dynamic": "tensor<?" in text or "x?" in text}
mesh = keras.distribution.DeviceMesh((2, 4), ("batch", "model"), devices.reshape(2, 4))
model_parallel = keras.distribution.ModelParallel(layout_map=get_layout_map(mesh, config=CONFIG), batch_dim_name="batch")
run, results["model_parallel"] = train("model_parallel", model_parallel)
kernel = run.model.backbone.blocks[0].attention.qkv_kernel.value
results["qkv"] = {"spec": [str(axis) for axis in kernel.sharding.spec],
                  "shard_shapes": sorted({tuple(s.data.shape) for s in kernel.addressable_shards}),
                  "devices": len(kernel.sharding.device_set)}
results["memory_spec"] = [str(axis) for axis in run._memory[0][0].sharding.spec]
# Dropout on, every replica given the same rows: each replica draws its own mask.
dropping = TransformerXLConfig.from_preset("tiny", n_token=CONFIG.n_token, dropout=0.5, dropatt=0.0)
with data_parallel.scope():
    from txl_keras import TransformerXLLM

    model = TransformerXLLM(dropping)
tokens = jax.device_put(np.tile(np.arange(8, dtype="int32")[None], (8, 1)),
                        jax.sharding.NamedSharding(data_parallel.device_mesh.backend_mesh,
                                                   jax.sharding.PartitionSpec("batch")))
hidden = np.asarray(model(tokens, training=True)["hidden"])
results["dropout_rows_differ"] = bool(all(np.abs(hidden[0] - hidden[r]).max() > 0 for r in range(1, 8)))
json.dump(results, sys.stdout)
