"""GPU training throughput of a wt103-base-sized Transformer-XL in bf16 under XLA.

    python bench/gpu_train.py                      # on a GPU machine, < 5 minutes
    python bench/gpu_train.py --tiny               # a CPU smoke test of the script

It runs on the backend Keras is set to. With KERAS_BACKEND=jax (the GPU machines here
have JAX but no TensorFlow) the step is one `jax.jit` (XLA) of forward, backward, global
norm clipping and Adam through `stateless_call`; with TensorFlow it is the txl_keras
Trainer with --xla. Prints tokens/s and model FLOP utilisation against the GPU's bf16
peak (989 TFLOP/s dense for an H100/H200, or --peak_tflops), for bf16 and float32.
"""

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import ROOT, model_flops_per_token, random_ids  # noqa: E402

from txl_keras.models.config import PRESETS  # noqa: E402

# The package's wt103_base preset (the fields this script varies; the rest is set below).
WT103_BASE = {k: PRESETS["wt103_base"][k] for k in ("n_token", "n_layer", "d_model", "n_head", "d_head",
                                                     "d_inner", "tgt_len", "mem_len", "cutoffs", "div_val")}
TINY = dict(n_token=1000, n_layer=2, d_model=64, n_head=4, d_head=16, d_inner=128,
            tgt_len=32, mem_len=32, cutoffs=[200, 500], div_val=1)


def run_jax(c, batch, steps, policy):
    import jax
    import jax.numpy as jnp
    import keras

    from txl_keras import TransformerXLConfig, TransformerXLLM

    config = TransformerXLConfig(**c, dropout=0.1, dropatt=0.0, untie_r=True, proj_share_all_but_first=True)
    model = TransformerXLLM(config, dtype=policy)
    model.build((batch, c["tgt_len"]))
    optimizer = keras.optimizers.Adam(2.5e-4)
    optimizer.build(model.trainable_variables)
    trainable = [v.value for v in model.trainable_variables]
    non_trainable = [v.value for v in model.non_trainable_variables]
    opt_vars = [v.value for v in optimizer.variables]

    def loss_fn(trainable, non_trainable, x, y, mems, valid):
        out, non_trainable = model.stateless_call(trainable, non_trainable, x, targets=y, mems=mems,
                                                  memory_valid=valid, training=True)
        return jnp.mean(out["nll"]), (out["mems"], out["memory_valid"], non_trainable)

    grad_fn = jax.value_and_grad(loss_fn, has_aux=True)

    @jax.jit
    def step(trainable, non_trainable, opt_vars, x, y, mems, valid):
        (loss, (mems, valid, non_trainable)), grads = grad_fn(trainable, non_trainable, x, y, mems, valid)
        norm = jnp.sqrt(sum(jnp.sum(jnp.square(g.astype(jnp.float32))) for g in grads))
        grads = [g * jnp.minimum(1.0, 0.25 / (norm + 1e-6)) for g in grads]
        trainable, opt_vars = optimizer.stateless_apply(opt_vars, grads, trainable)
        return loss, trainable, non_trainable, opt_vars, mems, valid

    tokens = batch * c["tgt_len"]
    ids = random_ids(tokens * (steps + 4) + batch, c["n_token"]).reshape(batch, -1)
    mems = [jnp.zeros((batch, c["mem_len"], c["d_model"]), model.compute_dtype)] * c["n_layer"]
    valid = jnp.array(0, jnp.int32)

    def run(i):
        nonlocal trainable, non_trainable, opt_vars, mems, valid
        x = ids[:, i * c["tgt_len"]:(i + 1) * c["tgt_len"]]
        y = ids[:, i * c["tgt_len"] + 1:(i + 1) * c["tgt_len"] + 1]
        loss, trainable, non_trainable, opt_vars, mems, valid = step(trainable, non_trainable, opt_vars, x, y,
                                                                     mems, valid)
        return loss

    start = time.perf_counter()
    run(0).block_until_ready()
    compile_s = time.perf_counter() - start
    for i in range(1, 3):
        run(i).block_until_ready()
    start = time.perf_counter()
    for i in range(3, 3 + steps):
        loss = run(i)
    loss.block_until_ready()
    elapsed = time.perf_counter() - start
    return tokens * steps / elapsed, float(loss), compile_s, jax.devices()[0].device_kind


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tiny", action="store_true")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--peak_tflops", type=float, default=989.0)
    parser.add_argument("--policies", default="mixed_bfloat16,float32")
    args = parser.parse_args()
    import keras

    if keras.config.backend() != "jax":
        raise SystemExit("Run with KERAS_BACKEND=jax (TensorFlow users: train_gpu.py --xla --precision=mixed_bfloat16).")
    c = TINY if args.tiny else WT103_BASE
    batch = 4 if args.tiny else args.batch
    flops = model_flops_per_token(c)
    print(f"command: KERAS_BACKEND=jax python bench/gpu_train.py {' '.join(sys.argv[1:])}")
    print(f"config {c}, batch {batch}: {flops / 1e9:.2f} GFLOP per token (training, formula of the reference)")
    for policy in args.policies.split(","):
        rate, loss, compile_s, device = run_jax(c, batch, 2 if args.tiny else args.steps, policy)
        print(f"{device} {policy:>15}: {rate:,.0f} tokens/s, {rate * flops / 1e12:.1f} TFLOP/s, "
              f"MFU {rate * flops / 1e12 / args.peak_tflops:.1%} of {args.peak_tflops:g} TFLOP/s bf16 peak "
              f"(loss {loss:.3f}, compile {compile_s:.0f} s)", flush=True)


if __name__ == "__main__":
    sys.path.insert(0, ROOT)
    main()
