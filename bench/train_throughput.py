"""Training throughput (tokens/s), peak memory and MFU: txl_keras vs the Hugging Face
PyTorch port of the original code, side by side, alternating, in fresh processes.

    python bench/train_throughput.py --config=char_small --rounds=2 \
        --hf_python=/path/to/venv-with-torch-2.13.0-and-transformers-4.35.2/bin/python

Each worker: same config, same random token stream, 2 threads, `--warmup` steps then
`--steps` timed steps of forward + backward + clip(0.25) + Adam. Without --hf_python only
txl_keras runs. Variants: --xla, --precision=mixed_bfloat16.
"""

import argparse
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import (CONFIGS, model_config, current_rss_mb, emit, matmul_ceiling_gflops, model_flops_per_token,  # noqa: E402
                    peak_rss_mb, random_ids, run_worker)


def txl_worker(args, c):
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(args.threads)
    tf.config.threading.set_inter_op_parallelism_threads(1 if args.xla else args.threads)
    from tf_records.records import write_split
    from txl_keras.training import TrainConfig, Trainer

    framework_mb = current_rss_mb()
    tokens_per_step = c["batch"] * c["tgt_len"]
    total_steps = args.warmup + args.steps
    records = tempfile.mkdtemp()
    write_split(random_ids(tokens_per_step * (total_steps + 2), c["n_token"]), records, "train", c["batch"],
                c["tgt_len"], vocab_size=c["n_token"], log=lambda *_: None)
    with open(os.path.join(records, "corpus-info.json"), "w") as f:
        f.write("{}")
    config = model_config(c, dropout=0.1, dropatt=0.0)
    tc = TrainConfig(model_dir=tempfile.mkdtemp(), records_dir=records, train_batch_size=c["batch"],
                     train_steps=args.warmup, iterations=args.warmup, save_steps=0, xla=args.xla,
                     precision=args.precision, deterministic=False)
    trainer = Trainer(tf.distribute.get_strategy(), config, tc, log=lambda *_: None)
    trainer.train()
    trainer.tc.train_steps = total_steps
    trainer.tc.iterations = args.steps
    start = time.perf_counter()
    trainer.train()
    elapsed = time.perf_counter() - start
    return {"tokens_per_s": tokens_per_step * args.steps / elapsed, "peak_rss_mb": peak_rss_mb(),
            "framework_rss_mb": framework_mb, "ceiling_gflops": matmul_ceiling_gflops()}


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
                             adaptive=bool(c["cutoffs"]), proj_share_all_but_first=True)
    model = TransfoXLLMHeadModel(config)
    model.train()
    optimizer = torch.optim.Adam(model.parameters(), lr=2.5e-4)
    tokens_per_step = c["batch"] * c["tgt_len"]
    ids = torch.from_numpy(random_ids(tokens_per_step * (args.warmup + args.steps + 2), c["n_token"]).astype("int64"))
    streams = ids[: c["batch"] * (ids.numel() // c["batch"])].view(c["batch"], -1)
    mems = None

    def step(i):
        nonlocal mems
        x = streams[:, i * c["tgt_len"]:(i + 1) * c["tgt_len"]]
        out = model(input_ids=x, labels=x, mems=mems)
        mems = out.mems
        loss = out.losses.mean() if out.losses is not None else out.loss.mean()
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.25)
        optimizer.step()

    for i in range(args.warmup):
        step(i)
    start = time.perf_counter()
    for i in range(args.warmup, args.warmup + args.steps):
        step(i)
    elapsed = time.perf_counter() - start
    return {"tokens_per_s": tokens_per_step * args.steps / elapsed, "peak_rss_mb": peak_rss_mb(),
            "framework_rss_mb": framework_mb}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="char_small", choices=sorted(CONFIGS))
    parser.add_argument("--impl", choices=["txl_keras", "hf"], help="run one worker (internal)")
    parser.add_argument("--hf_python", default=None, help="python with torch 2.13.0 + transformers 4.35.2")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--xla", action="store_true")
    parser.add_argument("--precision", default="float32")
    args = parser.parse_args()
    c = CONFIGS[args.config]
    if args.impl == "txl_keras":
        return emit(txl_worker(args, c))
    if args.impl == "hf":
        return emit(hf_worker(args, c))
    common = ["--config", args.config, "--warmup", str(args.warmup), "--steps", str(args.steps),
              "--threads", str(args.threads)]
    ours_args = common + ["--impl", "txl_keras", "--precision", args.precision] + (["--xla"] if args.xla else [])
    results = {"txl_keras": [], "hf": []}
    for _ in range(args.rounds):
        results["txl_keras"].append(run_worker(sys.executable, __file__, ours_args))
        if args.hf_python:
            results["hf"].append(run_worker(args.hf_python, __file__, common + ["--impl", "hf"]))
    flops = model_flops_per_token(c)
    ceiling = max(r["ceiling_gflops"] for r in results["txl_keras"])
    print(f"command: python bench/{os.path.basename(__file__)} " + " ".join(sys.argv[1:]))
    print(f"config {args.config}: {c}; {flops / 1e6:.1f} MFLOP per token (training); "
          f"fp32 matmul ceiling {ceiling:.0f} GFLOP/s; {args.threads} threads")
    best = {}
    for impl, runs in results.items():
        if not runs:
            continue
        rates = [r["tokens_per_s"] for r in runs]
        best[impl] = max(rates)
        peak = max(r["peak_rss_mb"] for r in runs)
        framework = min(r["framework_rss_mb"] for r in runs)
        print(f"{impl:>10}: tokens/s {' / '.join(f'{x:,.0f}' for x in rates)} (best {best[impl]:,.0f}), "
              f"MFU {best[impl] * flops / 1e9 / ceiling:.1%}, peak RSS {peak:,.0f} MB "
              f"(framework after import {framework:,.0f} MB, above it {peak - framework:,.0f} MB)")
    if "hf" in best:
        print(f"ratio txl_keras / hf: {best['txl_keras'] / best['hf']:.2f}x")


if __name__ == "__main__":
    main()
