"""Training throughput (tokens/s), peak memory and MFU: txl_keras vs the Hugging Face
PyTorch port of the original code, side by side, alternating, in fresh processes.

    python bench/train_throughput.py --config=char_small --rounds=2 \
        --hf_python=/path/to/venv-with-torch-2.13.0-and-transformers-4.35.2/bin/python

Each worker: same config, same random token stream, 2 threads, `--warmup` steps then
`--steps` timed steps of forward + backward + clip(0.25) + Adam. Without --hf_python only
txl_keras runs. `--jax` adds txl_keras's trainer on the JAX backend as a side (its JAX uses
the machine's cores; `--threads` sets TensorFlow's and PyTorch's). `--original_pytorch=DIR` (the `pytorch/` folder of a checkout of
kimiyoung/transformer-xl) also runs the original PyTorch code's `MemTransformerLM` with the
--hf_python interpreter; the changes made to it at run time are that its uint8 attention
masks are made boolean (`Tensor.byte` returns a bool tensor in that worker), which torch 2
requires of `masked_fill`, and `torch.version.cuda`, which it parses at import (for a check
it has commented out), is set on CPU builds. Variants: --xla, --precision=mixed_bfloat16 (every
side: ours Keras's mixed_bfloat16 policy, the two PyTorch models their forward pass under
`torch.autocast("cpu", torch.bfloat16)`, PyTorch's mixed precision on CPUs; their adaptive
embeddings copy bf16 rows into a float32 buffer with `index_copy_`, which torch rejects, so
in that mode `index_copy_` casts its source to the buffer's dtype, as the rows would be in
float32; `--torch_precision=float32` keeps them in float32). `--baseline=DIR` adds the
txl_keras checkout in DIR (another commit) as a side, so that a change is measured against
the code before it in one run. Token ids are Zipf-like
(p(id) ~ 1 / (id + 1)) for adaptive configs, as in real text (`--ids=uniform` puts nearly
every token in a tail cluster, which no corpus does). `--profile` also times the adaptive
embedding and softmax alone (forward + backward on the same batch) and prints their share
of the step's time next to their share of its FLOPs; `--ops` prints our step's op time by
op type, from the TensorFlow profiler's trace of one more call of `--steps` steps, and the
most tokens/s the step's matrix products alone allow at the rate they ran; with
`--one_op_at_a_time` ours runs on one inter-op thread in one part, so that op times add up
to the step's. Every run also prints the most tokens/s the measured matrix-product ceiling
allows (100% MFU; for mixed_bfloat16 the bfloat16 ceiling too) and the MFU 3x each
PyTorch side's best would need.
"""

import argparse
import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import (CONFIG_NAMES, cluster_shares, configs, model_config, current_rss_mb, emit, matmul_ceiling_gflops,  # noqa: E402
                    model_flops_per_token, peak_rss_mb, random_ids, ratio_line, run_rounds, run_worker)


def ids_for(args, c, n):
    return random_ids(n, c["n_token"], zipf=args.ids == "zipf")


def adaptive_profile(trainer, c, tokens, repeats=10):
    """Seconds per forward + backward of the adaptive embedding and of the adaptive
    softmax alone, on one step's batch (the layers' own variables; tied tables included)."""
    import tensorflow as tf

    model = trainer.model
    emb, soft = model.backbone.word_emb, model.softmax
    x = tf.constant(tokens[: c["batch"] * c["tgt_len"]].reshape(c["batch"], c["tgt_len"]))
    y = tf.roll(x, -1, axis=1)
    shape = [c["batch"], c["tgt_len"], c["d_model"]]  # in the layers' compute dtype (bf16 for mixed_bfloat16)
    cotangent = tf.random.normal(shape, dtype=emb.compute_dtype)
    hidden = tf.random.normal(shape, dtype=soft.compute_dtype)

    def done(grads):
        # Dense, as the training step makes them (`Trainer`), inside the function; one
        # scalar that needs every gradient is all that leaves it (copying the tables to
        # the host, or densifying them eagerly, is no part of a step).
        dense = [tf.convert_to_tensor(g) for g in grads if g is not None]
        return tf.add_n([tf.cast(tf.reshape(g, [-1])[0], tf.float32) for g in dense])

    @tf.function
    def embedding_step():
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(emb(x) * cotangent)
        return done(tape.gradient(loss, emb.trainable_variables))

    @tf.function
    def softmax_step():
        with tf.GradientTape() as tape:
            tape.watch(hidden)
            loss = tf.reduce_sum(soft(hidden, y))
        return done(tape.gradient(loss, soft.trainable_variables + [hidden]))

    out = {}
    for name, fn in (("embedding", embedding_step), ("softmax", softmax_step)):
        fn()
        start = time.perf_counter()
        for _ in range(repeats):
            fn().numpy()
        out[name] = (time.perf_counter() - start) / repeats
    return out


def adaptive_flops(c, shares):
    """Training FLOPs per token of the adaptive embedding (its projections) and softmax."""
    from txl_keras.models.flops import softmax_macs_per_token

    config = model_config(c)
    bounds = [0] + list(c["cutoffs"]) + [c["n_token"]]
    widths = [config.d_embed // config.div_val ** i for i in range(len(bounds) - 1)]
    projected = [w != config.d_model or config.div_val > 1 for w in widths]
    embedding = sum(6 * s * w * config.d_model for s, w, p in zip(shares, widths, projected) if p)
    return embedding, 6 * softmax_macs_per_token(config, shares[1:] if len(shares) > 1 else None)


def txl_worker(args, c):
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(args.threads)
    sequential = args.xla or args.one_op_at_a_time
    tf.config.threading.set_inter_op_parallelism_threads(1 if sequential else args.threads)
    from tf_records.records import write_split
    from txl_keras.training import TrainConfig, Trainer

    framework_mb = current_rss_mb()
    tokens_per_step = c["batch"] * c["tgt_len"]
    total_steps = args.warmup + args.steps
    records = tempfile.mkdtemp()
    ids = ids_for(args, c, tokens_per_step * (total_steps + 2))
    write_split(ids, records, "train", c["batch"], c["tgt_len"], vocab_size=c["n_token"], log=lambda *_: None)
    with open(os.path.join(records, "corpus-info.json"), "w") as f:
        f.write("{}")
    config = model_config(c, dropout=0.1, dropatt=0.0)
    tc = TrainConfig(model_dir=tempfile.mkdtemp(), records_dir=records, train_batch_size=c["batch"],
                     train_steps=args.warmup, iterations=args.warmup, save_steps=0, xla=args.xla,
                     precision=args.precision, deterministic=False,
                     concurrent_parts=1 if args.one_op_at_a_time else 0)
    if args.backend == "jax":  # the same loop and step on JAX (one XLA program per step)
        from txl_keras.training.jax_trainer import JaxTrainer

        trainer = JaxTrainer(None, config, tc, log=lambda *_: None)
    else:
        trainer = Trainer(tf.distribute.get_strategy(), config, tc, log=lambda *_: None)
    trainer.save = lambda: None  # a run's closing checkpoint is not a step: not timed
    trainer.train()
    trainer.tc.train_steps = total_steps
    trainer.tc.iterations = args.steps
    start = time.perf_counter()
    trainer.train()
    elapsed = time.perf_counter() - start
    result = {"tokens_per_s": tokens_per_step * args.steps / elapsed, "peak_rss_mb": peak_rss_mb(),
              "framework_rss_mb": framework_mb, "ceiling_gflops": matmul_ceiling_gflops(),
              "step_s": elapsed / args.steps}
    if args.precision == "mixed_bfloat16":
        result["bf16_ceiling_gflops"] = matmul_ceiling_gflops(dtype="bfloat16")
    if args.profile and c["cutoffs"]:
        result["adaptive_s"] = adaptive_profile(trainer, c, ids)
    if args.ops:  # one more call of --steps steps, traced by the profiler
        from op_profile import op_ms_by_type

        trainer.tc.train_steps += args.steps
        by_type, total = op_ms_by_type(trainer.train)
        result["op_ms"] = {kind: [ms / args.steps, n / args.steps] for kind, (ms, n) in by_type.items()}
        result["op_total_ms"] = total / args.steps
    return result


def timed_torch_steps(step, args, tokens_per_step, framework_mb):
    """Run `step(i)` `--warmup` times, then time `--steps` more: a torch worker's RESULT."""
    for i in range(args.warmup):
        step(i)
    start = time.perf_counter()
    for i in range(args.warmup, args.warmup + args.steps):
        step(i)
    elapsed = time.perf_counter() - start
    return {"tokens_per_s": tokens_per_step * args.steps / elapsed, "peak_rss_mb": peak_rss_mb(),
            "framework_rss_mb": framework_mb}


def torch_precision(args):
    """The context a torch worker's forward pass runs in: `torch.autocast` to bf16 for
    mixed_bfloat16 (with `index_copy_` casting its source, see the module's docstring),
    else none."""
    import contextlib

    import torch

    if args.precision != "mixed_bfloat16":
        return contextlib.nullcontext
    index_copy = torch.Tensor.index_copy_
    torch.Tensor.index_copy_ = lambda self, dim, index, source: index_copy(self, dim, index, source.to(self.dtype))
    return lambda: torch.autocast("cpu", dtype=torch.bfloat16)


def hf_worker(args, c):
    import torch
    from transformers import TransfoXLConfig, TransfoXLLMHeadModel

    framework_mb = current_rss_mb()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    config = TransfoXLConfig(vocab_size=c["n_token"], cutoffs=c["cutoffs"], d_model=c["d_model"],
                             d_embed=c["d_model"], n_head=c["n_head"], d_head=c["d_head"], d_inner=c["d_inner"],
                             div_val=c["div_val"], n_layer=c["n_layer"], mem_len=c["mem_len"],
                             clamp_len=-1, same_length=False, dropout=0.1, dropatt=0.0, untie_r=False,
                             adaptive=bool(c["cutoffs"]),
                             proj_share_all_but_first=c.get("proj_share_all_but_first", True))
    model = TransfoXLLMHeadModel(config)
    precision = torch_precision(args)
    model.train()
    optimizer = torch.optim.Adam(model.parameters(), lr=2.5e-4)
    tokens_per_step = c["batch"] * c["tgt_len"]
    ids = torch.from_numpy(ids_for(args, c, tokens_per_step * (args.warmup + args.steps + 2)).astype("int64"))
    streams = ids[: c["batch"] * (ids.numel() // c["batch"])].view(c["batch"], -1)
    mems = None

    def step(i):
        nonlocal mems
        x = streams[:, i * c["tgt_len"]:(i + 1) * c["tgt_len"]]
        with precision():
            out = model(input_ids=x, labels=x, mems=mems)
        mems = out.mems
        loss = out.losses.mean() if out.losses is not None else out.loss.mean()
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.25)
        optimizer.step()

    return timed_torch_steps(step, args, tokens_per_step, framework_mb)


def original_worker(args, c):
    """The original PyTorch code's model and training step (pytorch/train.py): time-major
    batches, tied weights, the tail projections shared with the input as for wt103."""
    import torch

    sys.path[:0] = [args.original_pytorch, os.path.join(args.original_pytorch, "utils")]  # as run from there
    torch.Tensor.byte = torch.Tensor.bool  # torch 2 masks must be boolean; the 2019 code makes uint8 ones
    torch.version.cuda = torch.version.cuda or "10.0"  # read (unused) at import; None on CPU builds
    from mem_transformer import MemTransformerLM

    framework_mb = current_rss_mb()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    cutoffs = c["cutoffs"]
    tie_projs = [False] + [bool(c.get("proj_share_all_but_first", True))] * len(cutoffs)
    model = MemTransformerLM(c["n_token"], c["n_layer"], c["n_head"], c["d_model"], c["d_head"], c["d_inner"],
                             dropout=0.1, dropatt=0.0, tie_weight=True, d_embed=c["d_model"], div_val=c["div_val"],
                             tie_projs=tie_projs, tgt_len=c["tgt_len"], ext_len=0, mem_len=c["mem_len"],
                             cutoffs=cutoffs, same_length=False, attn_type=0, clamp_len=-1)
    precision = torch_precision(args)
    model.train()
    optimizer = torch.optim.Adam(model.parameters(), lr=2.5e-4)
    tokens_per_step = c["batch"] * c["tgt_len"]
    ids = torch.from_numpy(ids_for(args, c, tokens_per_step * (args.warmup + args.steps + 2)).astype("int64"))
    streams = ids[: c["batch"] * (ids.numel() // c["batch"])].view(c["batch"], -1).t().contiguous()  # (time, batch)
    mems = tuple()

    def step(i):
        nonlocal mems
        t = c["tgt_len"]
        with precision():
            out = model(streams[i * t:(i + 1) * t], streams[i * t + 1:(i + 1) * t + 1], *mems)
        loss, mems = out[0].float().mean(), tuple(out[1:])
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.25)
        optimizer.step()

    return timed_torch_steps(step, args, tokens_per_step, framework_mb)


def print_bounds(ours, rates, flops, ceiling):
    """What 3x each PyTorch side's best would take: tokens/s and the MFU over the measured
    matrix-product ceiling (float32, and bfloat16's where measured), against the most
    tokens/s that ceiling allows at the model's FLOPs per token."""
    ceilings = [("float32", ceiling)]
    bf16 = [r["bf16_ceiling_gflops"] for r in ours if "bf16_ceiling_gflops" in r]
    if bf16:
        ceilings.append(("bfloat16", max(bf16)))
    for name, gflops in ceilings:
        bound = gflops * 1e9 / flops
        line = f"{name} ceiling {gflops:.0f} GFLOP/s: at most {bound:,.0f} tokens/s at 100% MFU; " \
            f"ours {max(rates['txl_keras']) / bound:.1%}"
        for impl in ("hf", "original"):
            if impl in rates:
                needed = 3 * max(rates[impl])
                line += f"; 3x {impl}'s best {needed:,.0f} tokens/s needs {needed / bound:.1%}"
        print(line)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="char_small", choices=CONFIG_NAMES)
    parser.add_argument("--config_json", help="the config itself (internal: main process -> workers)")
    parser.add_argument("--impl", choices=["txl_keras", "hf", "original"], help="run one worker (internal)")
    parser.add_argument("--original_pytorch", default=None,
                        help="pytorch/ folder of kimiyoung/transformer-xl (run with --hf_python)")
    parser.add_argument("--hf_python", default=None, help="python with torch 2.13.0 + transformers 4.35.2")
    parser.add_argument("--baseline", default=None, help="a txl_keras checkout (another commit) run as a side")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--xla", action="store_true")
    parser.add_argument("--jax", action="store_true", help="add txl_keras on the JAX backend as a side")
    parser.add_argument("--backend", default="tensorflow", choices=["tensorflow", "jax"], help="(internal)")
    parser.add_argument("--precision", default="float32", choices=["float32", "mixed_bfloat16"])
    parser.add_argument("--torch_precision", default=None, choices=["float32", "mixed_bfloat16"],
                        help="the PyTorch workers' precision (default: --precision's)")
    parser.add_argument("--ids", choices=["zipf", "uniform"], default=None,
                        help="token id distribution (default: zipf with cutoffs, else uniform)")
    parser.add_argument("--profile", action="store_true", help="time the adaptive layers alone too")
    parser.add_argument("--ops", action="store_true", help="our step's op time by op type (the profiler's trace)")
    parser.add_argument("--one_op_at_a_time", action="store_true",
                        help="ours on one inter-op thread and in one part: with --ops, op times add up to the step's")
    args = parser.parse_args()
    c = json.loads(args.config_json) if args.config_json else configs()[args.config]
    args.ids = args.ids or ("zipf" if c["cutoffs"] else "uniform")
    if args.impl == "txl_keras":
        return emit(txl_worker(args, c))
    if args.impl == "hf":
        return emit(hf_worker(args, c))
    if args.impl == "original":
        return emit(original_worker(args, c))
    their_precision = args.torch_precision or args.precision
    theirs = ["--precision", their_precision]
    common = ["--config", args.config, "--warmup", str(args.warmup), "--steps", str(args.steps),
              "--threads", str(args.threads), "--ids", args.ids, "--config_json", json.dumps(c)]
    ours_args = common + ["--impl", "txl_keras", "--precision", args.precision] + (["--xla"] if args.xla else []) \
        + (["--profile"] if args.profile else []) + (["--ops"] if args.ops else []) \
        + (["--one_op_at_a_time"] if args.one_op_at_a_time else [])
    workers = [("txl_keras", lambda: run_worker(sys.executable, __file__, ours_args))]
    if args.jax:
        workers.append(("jax", lambda: run_worker(sys.executable, __file__, ours_args + ["--backend", "jax"],
                                                  env={"KERAS_BACKEND": "jax"})))
    if args.baseline:
        script = os.path.join(os.path.abspath(args.baseline), "bench", os.path.basename(__file__))
        workers.append(("baseline", lambda: run_worker(sys.executable, script, ours_args)))
    if args.hf_python:
        workers.append(("hf", lambda: run_worker(args.hf_python, __file__, common + theirs + ["--impl", "hf"])))
    if args.hf_python and args.original_pytorch:
        workers.append(("original", lambda: run_worker(args.hf_python, __file__, common + theirs + [
            "--impl", "original", "--original_pytorch", os.path.abspath(args.original_pytorch)])))
    results = run_rounds(args.rounds, workers)
    shares = cluster_shares(ids_for(args, c, 200_000), c["cutoffs"], c["n_token"])
    flops = model_flops_per_token(c, shares=shares)
    ceiling = max(r["ceiling_gflops"] for r in results["txl_keras"])
    print(f"command: python bench/{os.path.basename(__file__)} " + " ".join(sys.argv[1:]))
    print(f"config {args.config}: {c}; {args.ids} ids (cluster shares {', '.join(f'{s:.3f}' for s in shares)}); "
          f"{flops / 1e6:.1f} MFLOP per token (training); fp32 matmul ceiling {ceiling:.0f} GFLOP/s; "
          f"{args.threads} threads; precision: ours {args.precision}, PyTorch {their_precision}")
    rates = {impl: [r["tokens_per_s"] for r in runs] for impl, runs in results.items() if runs}
    for impl, runs in results.items():
        if not runs:
            continue
        best = max(rates[impl])
        peak = max(r["peak_rss_mb"] for r in runs)
        framework = min(r["framework_rss_mb"] for r in runs)
        print(f"{impl:>10}: tokens/s {' / '.join(f'{x:,.0f}' for x in rates[impl])} (best {best:,.0f}), "
              f"MFU {best * flops / 1e9 / ceiling:.1%}, peak RSS {peak:,.0f} MB "
              f"(framework after import {framework:,.0f} MB, above it {peak - framework:,.0f} MB)")
    for impl in ("jax", "baseline", "hf", "original"):
        if impl in rates:
            print(ratio_line(impl, rates["txl_keras"], rates[impl]))
    print_bounds(results["txl_keras"], rates, flops, ceiling)
    profiles = [r for r in results["txl_keras"] if "adaptive_s" in r]
    if profiles:
        run = min(profiles, key=lambda r: r["step_s"])
        emb_flops, soft_flops = adaptive_flops(c, shares)
        tokens = c["batch"] * c["tgt_len"]
        for name, layer_flops in (("embedding", emb_flops), ("softmax", soft_flops)):
            time_share = run["adaptive_s"][name] / run["step_s"]
            flop_share = layer_flops / flops
            print(f"adaptive {name}: {run['adaptive_s'][name] * 1e3:.1f} ms of a {run['step_s'] * 1e3:.0f} ms step "
                  f"({time_share:.1%} of the time, {flop_share:.1%} of the FLOPs: {time_share / flop_share:.2f}x; "
                  f"{layer_flops * tokens / run['adaptive_s'][name] / 1e9:.0f} GFLOP/s)")
    traced = [r for r in results["txl_keras"] if "op_ms" in r]
    if traced:
        from op_profile import print_op_profile

        run = min(traced, key=lambda r: r["step_s"])
        print_op_profile({kind: tuple(v) for kind, v in run["op_ms"].items()}, run["op_total_ms"],
                         run["step_s"] * 1e3, overlap=not args.one_op_at_a_time)
        products = sum(ms for kind, (ms, _) in run["op_ms"].items() if "MatMul" in kind)
        tokens = c["batch"] * c["tgt_len"]
        print(f"matrix products: {products:.0f} ms per step, {flops * tokens / products / 1e6:.0f} GFLOP/s over the "
              f"model's FLOPs; the products alone at that rate: at most {tokens / products * 1e3:,.0f} tokens/s"
              + ("" if args.one_op_at_a_time else " (ops overlap: run with --one_op_at_a_time for the floor)"))


if __name__ == "__main__":
    main()
