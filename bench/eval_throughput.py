"""Evaluation throughput with long memory, txl_keras vs the Hugging Face PyTorch port,
and the paper's evaluation-speed experiment at small scale.

    python bench/eval_throughput.py --hf_python=/path/to/python-with-torch-and-transformers

1. Long-memory evaluation (tgt_len 64, mem_len 320, clamp_len 400, same_length), char-small
   model, batch 16: tokens/s of both, side by side, alternating, fresh processes. Ours as
   the trainers' evaluation runs it: XLA-compiled, the memory held as its keys and values
   (ring buffers written in place) instead of re-projected; `--ablations` adds a run
   without XLA (`TrainConfig.eval_xla=False`). `--baseline=DIR` adds the txl_keras checkout
   in DIR (another commit) as a side. Peak memory is also given above the RSS right after
   importing the framework (TensorFlow's import is larger than torch's), and on a GPU the
   device's peak memory.
   `--jax`: both sides on JAX (the JAX trainer's evaluation, `JaxTrainer.evaluate`, one
   device), the baseline's code driven by this script.
   `--model=wt103_base` instead: the paper's wt103 evaluation (tgt_len 128, mem_len 1,600,
   clamp_len 1,000, same_length, zero-filled memory as the converted weights have) of the
   `wt103_base` preset (16 layers, d_model 410, adaptive softmax over 267,735 words) on
   Zipf-distributed ids, with `--batch` streams (8; 1 is a user scoring one document) and
   `--segments` per pass (6; ours times whole passes, reset included, the port its calls).
   `--model=enwik8_base`: the paper's enwik8 base evaluation (tgt_len 80, mem_len 2,100,
   clamp_len 820, same_length, batch 10; 12 layers, d_model 512) on uniform byte ids.
   `--model=wt103_large`, `enwik8_large` (text8's release has the same size) or `lm1b_large`:
   the released models' architectures at their evaluation settings, one stream, random
   weights: the time and memory of scoring a text with a released model here.
2. Transformer-XL evaluation (segments of 64 against a memory of L) vs vanilla
   sliding-window evaluation (mem_len 0, a window of L recomputed for each predicted
   token), at attention lengths L = 128, 320, 640: per-token speed-up, next to the
   paper's 363x at 800 and 1,874x at 3,800 (one GPU).
"""

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import cluster_shares, configs, current_rss_mb, emit, matmul_ceiling_gflops, model_config, model_flops_per_token, peak_rss_mb, random_ids, ratio_line, run_rounds, run_worker  # noqa: E402

EVAL = dict(tgt_len=64, mem_len=320, clamp_len=400, same_length=True, batch=16, segments=8)
EVAL_WT103 = dict(tgt_len=128, mem_len=1600, clamp_len=1000, same_length=True, batch=8, segments=6, zipf=True)
EVAL_ENWIK8 = dict(tgt_len=80, mem_len=2100, clamp_len=820, same_length=True, batch=10, segments=6)
# The released models' sizes at their evaluation settings (tf/sota/*.sh), one stream:
# what scoring a document with a released model costs on this machine (random weights).
RELEASE_EVALS = {
    "wt103_large": dict(tgt_len=128, mem_len=1600, clamp_len=1000, same_length=True, batch=1, segments=4, zipf=True),
    "enwik8_large": dict(tgt_len=128, mem_len=3800, clamp_len=1000, same_length=True, batch=1, segments=4),
    "lm1b_large": dict(tgt_len=32, mem_len=128, clamp_len=-1, same_length=True, batch=1, segments=16, zipf=True),
}
PAPER_EVALS = {"wt103_base": EVAL_WT103, "enwik8_base": EVAL_ENWIK8, **RELEASE_EVALS}


def txl_model(c):
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(2)
    tf.config.threading.set_inter_op_parallelism_threads(2)
    from txl_keras import TransformerXLLM

    config = model_config(c, dropout=0.0)
    model = TransformerXLLM(config)
    model.build((None, c["tgt_len"]))
    return tf, model


def txl_eval_worker(c, e):
    """The trainers' own evaluation (`Trainer.evaluate`: the backbone XLA-compiled, the
    memory held as keys and values written in place) over records of random ids, a whole
    pass timed (the best of two, after a first that compiles)."""
    import tempfile

    os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(2)
    tf.config.threading.set_inter_op_parallelism_threads(2)
    from tf_records.records import write_split
    from txl_keras.training import TrainConfig

    imported_mb = current_rss_mb()
    records = tempfile.mkdtemp()
    ids = random_ids(e["batch"] * e["tgt_len"] * e["segments"] + 1, c["n_token"], zipf=e.get("zipf", False))
    write_split(ids, records, "valid", e["batch"], e["tgt_len"], vocab_size=c["n_token"], log=lambda *_: None)
    tc = TrainConfig(model_dir=tempfile.mkdtemp(), records_dir=records, train_batch_size=e["batch"],
                     eval_batch_size=e["batch"], eval_tgt_len=e["tgt_len"], eval_mem_len=e["mem_len"],
                     eval_clamp_len=e["clamp_len"], eval_same_length=e["same_length"],
                     eval_xla=os.environ.get("TXL_BENCH_XLA", "1") != "0")
    if os.environ.get("KERAS_BACKEND") == "jax":
        from txl_keras.training.jax_trainer import JaxTrainer

        trainer = JaxTrainer(None, model_config(c, dropout=0.0), tc, log=lambda *_: None)
    else:
        from txl_keras.training import Trainer

        trainer = Trainer(tf.distribute.get_strategy(), model_config(c, dropout=0.0), tc, log=lambda *_: None)
    trainer.evaluate(progress=False, summaries=False)  # compiles
    rates = []
    for _ in range(2):
        start = time.perf_counter()
        result = trainer.evaluate(progress=False, summaries=False)
        rates.append(result["tokens"] / (time.perf_counter() - start))
    out = {"tokens_per_s": max(rates), "peak_rss_mb": peak_rss_mb(), "import_rss_mb": imported_mb,
           "package": os.path.dirname(os.path.dirname(sys.modules["txl_keras"].__file__)), "loss": result["loss"]}
    if tf.config.list_physical_devices("GPU"):  # on a GPU the memory that matters is the device's
        out["gpu_peak_mb"] = tf.config.experimental.get_memory_info("GPU:0")["peak"] / 2**20
    out["ceiling_gflops"] = matmul_ceiling_gflops()  # (after the peak memory was read)
    return out


def hf_eval_worker(c, e):
    import torch
    from transformers import TransfoXLConfig, TransfoXLLMHeadModel

    torch.set_num_threads(2)
    imported_mb = current_rss_mb()
    config = TransfoXLConfig(vocab_size=c["n_token"], cutoffs=c["cutoffs"], d_model=c["d_model"],
                             d_embed=c["d_model"], n_head=c["n_head"], d_head=c["d_head"], d_inner=c["d_inner"],
                             n_layer=c["n_layer"], mem_len=e["mem_len"], clamp_len=e["clamp_len"],
                             same_length=e["same_length"], dropout=0.0, dropatt=0.0, adaptive=bool(c["cutoffs"]),
                             div_val=c["div_val"], untie_r=c.get("untie_r", False),
                             proj_share_all_but_first=c.get("proj_share_all_but_first", False))
    model = TransfoXLLMHeadModel(config).eval()
    ids = torch.from_numpy(random_ids(e["batch"] * e["tgt_len"] * (e["segments"] + 3) + e["batch"],
                                      c["n_token"], zipf=e.get("zipf", False)).astype("int64")).view(e["batch"], -1)
    mems, times = None, []
    with torch.no_grad():
        for i in range(e["segments"] + 2):
            x = ids[:, i * e["tgt_len"]:(i + 1) * e["tgt_len"]]
            start = time.perf_counter()
            out = model(input_ids=x, labels=x, mems=mems)
            mems = out.mems
            times.append(time.perf_counter() - start)
    return {"tokens_per_s": e["batch"] * e["tgt_len"] * e["segments"] / sum(times[2:]), "peak_rss_mb": peak_rss_mb(),
            "import_rss_mb": imported_mb}


def speedup_worker(c, length, batch=16):
    """Seconds per predicted token: Transformer-XL with memory `length` vs vanilla windows."""
    tf, model = txl_model(c)
    segment = c["tgt_len"]
    ids = random_ids(batch * (length + segment * 4 + 1), c["n_token"]).reshape(batch, -1)
    xl = tf.function(lambda x, cache: model.call_with_cache(x, cache, mem_len=length, same_length=True,
                                                            return_log_probs=True))
    cache = model.init_cache(batch, mem_len=length, segment_length=segment)
    times = []
    for i in range(4):
        start = time.perf_counter()
        out, cache = xl(ids[:, i * segment:(i + 1) * segment], cache)
        out["log_probs"].numpy()
        times.append(time.perf_counter() - start)
    xl_per_token = sum(times[1:]) / (3 * segment * batch)
    vanilla = tf.function(lambda x: model(x, mem_len=0, return_log_probs=True)["log_probs"][:, -1])
    times = []
    for i in range(4):  # each call predicts one token per row from a full window
        start = time.perf_counter()
        vanilla(ids[:, i:i + length]).numpy()
        times.append(time.perf_counter() - start)
    vanilla_per_token = sum(times[1:]) / (3 * batch)
    return {"xl_s_per_token": xl_per_token, "vanilla_s_per_token": vanilla_per_token}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--impl", choices=["txl_keras", "hf", "speedup"], help="run one worker (internal)")
    parser.add_argument("--length", type=int, default=128)
    parser.add_argument("--hf_python", default=None)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--lengths", default="128,320,640")
    parser.add_argument("--ablations", action="store_true", help="also run ours without XLA")
    parser.add_argument("--baseline", default=None, help="a txl_keras checkout (another commit) run as a side")
    parser.add_argument("--jax", action="store_true", help="every side on JAX (the JAX trainer's evaluation)")
    parser.add_argument("--config_json", help="the config itself (internal: main process -> workers)")
    parser.add_argument("--model", choices=["char_small", *PAPER_EVALS], default="char_small")
    parser.add_argument("--batch", type=int, default=None,
                        help="streams (default: 16 char_small, 8 wt103_base, 10 enwik8_base)")
    parser.add_argument("--segments", type=int, default=None, help="timed segments per pass")
    args = parser.parse_args()
    if args.config_json:
        c = json.loads(args.config_json)
    elif args.model in PAPER_EVALS:
        from txl_keras.models.config import TransformerXLConfig

        c = TransformerXLConfig.from_preset(args.model, dropout=0.0, tgt_len=PAPER_EVALS[args.model]["tgt_len"],
                                            mem_init="zeros").to_dict()
    else:
        c = {**configs()["char_small"], "tgt_len": 64}
    e = dict(PAPER_EVALS.get(args.model, EVAL))
    e.update({k: v for k, v in (("batch", args.batch), ("segments", args.segments)) if v})
    config_arg = ["--config_json", json.dumps(c), "--model", args.model] + \
        [f"--{k}={v}" for k, v in (("batch", args.batch), ("segments", args.segments)) if v]
    if args.impl == "txl_keras":
        return emit(txl_eval_worker(c, e))
    if args.impl == "hf":
        return emit(hf_eval_worker(c, e))
    if args.impl == "speedup":
        return emit(speedup_worker(c, args.length))
    print(f"command: python bench/{os.path.basename(__file__)} " + " ".join(sys.argv[1:]))
    ablations = {"txl_keras no XLA": {"TXL_BENCH_XLA": "0"}}
    on_jax = {"KERAS_BACKEND": "jax", "JAX_PLATFORMS": "cpu"} if args.jax else None
    workers = [("txl_keras", lambda: run_worker(sys.executable, __file__, ["--impl", "txl_keras"] + config_arg,
                                                env=on_jax))]
    if args.baseline and args.jax:  # (this script, the baseline's package)
        baseline = {**on_jax, "TXL_BENCH_PACKAGES": os.path.abspath(args.baseline)}
        workers.append(("baseline", lambda: run_worker(sys.executable, __file__, ["--impl", "txl_keras"] + config_arg,
                                                       env=baseline)))
    elif args.baseline:
        script = os.path.join(os.path.abspath(args.baseline), "bench", os.path.basename(__file__))
        workers.append(("baseline", lambda: run_worker(sys.executable, script, ["--impl", "txl_keras"] + config_arg)))
    if args.hf_python:
        workers.append(("hf", lambda: run_worker(args.hf_python, __file__, ["--impl", "hf"] + config_arg)))
    for name, env in ablations.items() if args.ablations else ():
        workers.append((name, lambda env=env: run_worker(sys.executable, __file__, ["--impl", "txl_keras"] + config_arg,
                                                          env=env)))
    results = run_rounds(args.rounds, workers)
    shares = cluster_shares(random_ids(200_000, c["n_token"], zipf=e.get("zipf", False)), c["cutoffs"], c["n_token"]) \
        if c["cutoffs"] else None
    flops = model_flops_per_token(c, training=False, mem_len=e["mem_len"], tgt_len=e["tgt_len"], shares=shares)
    ceiling = max((r["ceiling_gflops"] for runs in results.values() for r in runs if "ceiling_gflops" in r),
                  default=float("nan"))
    print(f"1. long-memory evaluation {e}, {args.model} model, {flops / 1e6:.1f} MFLOP per token; "
          f"fp32 matmul ceiling {ceiling:.0f} GFLOP/s")
    rates = {impl: [r["tokens_per_s"] for r in runs] for impl, runs in results.items() if runs}
    for impl, runs in results.items():
        if runs:
            peak = max(r["peak_rss_mb"] for r in runs)
            above = max(r["peak_rss_mb"] - r["import_rss_mb"] for r in runs)
            gflops = max(rates[impl]) * flops / 1e9
            if "package" in runs[0]:
                print(f"{impl:>10}: txl_keras from {runs[0]['package']}, validation loss {runs[0]['loss']:.6f}")
            print(f"{impl:>10}: tokens/s {' / '.join(f'{x:,.0f}' for x in rates[impl])} ({gflops:.1f} GFLOP/s, "
                  f"MFU {gflops / ceiling:.1%}), peak RSS {peak:,.0f} MB, {above:,.0f} MB "
                  "above the framework's import" +
                  (f", GPU peak {max(r['gpu_peak_mb'] for r in runs):,.0f} MB" if "gpu_peak_mb" in runs[0] else ""))
    for impl in rates:
        if impl != "txl_keras":
            print(ratio_line(impl, rates["txl_keras"], rates[impl]))
    if args.model != "char_small" or not args.lengths:
        return
    print("2. evaluation speed, Transformer-XL vs vanilla sliding window (per predicted token)")
    for length in [int(x) for x in args.lengths.split(",")]:
        r = run_worker(sys.executable, __file__, ["--impl", "speedup", "--length", str(length)] + config_arg)
        print(f"attention length {length:>4}: Transformer-XL {r['xl_s_per_token'] * 1e3:.3f} ms, vanilla "
              f"{r['vanilla_s_per_token'] * 1e3:.1f} ms -> {r['vanilla_s_per_token'] / r['xl_s_per_token']:,.0f}x "
              "(paper: 363x at 800, 1,874x at 3,800)")


if __name__ == "__main__":
    main()
