"""Greedy generation with long memory, txl_keras vs the Hugging Face PyTorch port.

    python bench/generate_throughput.py --hf_python=/path/to/python-with-torch-and-transformers

The `wt103_base` preset (16 layers, d_model 410, adaptive softmax over 267,735 words) at
the paper's evaluation memory (mem_len 1,600, clamp_len 1,000, same_length), batch 1: a
prompt of one segment (128 Zipf-distributed ids), then new tokens one at a time. Ours is
`txl_keras.generate` (the memory as keys and values, position keys projected once per
call, compiled steps reused between calls); the port runs its model token by token with
its `mems`, as its `generate` does. Per-token time is the difference between producing
`--long` and `--short` new tokens divided by their difference (prompt and compilation
cancel out), the best of two calls each; ours also prints the fixed cost of a call and the
time of the process's first call (`--short` new tokens, tracing and compilation included).
`--baseline=DIR` adds the txl_keras checkout in DIR (another commit) as a side; with
`--rounds=N` every worker runs N times, each side in its own process, the sides alternating
(`common.run_rounds`), and each figure is the best round's (the baseline's ratio also round by
round and their median: two processes of one side differ by up to 15% on a small VM).

Ours also runs, each in its own process, the same model on: a batch of 8 prompts of
different lengths, 72 to 128 tokens (`batch8`: tokens/s of the batch against one prompt at
a time, both measured in that process, their calls interleaved, the median of three
rounds' ratios; its long calls make `--batch_long` new tokens, so that the batch's ~5 s of
prompts and their spread cancel), beam search with 4 beams (`beam4`: time per new token
against greedy), and the SavedModel's in-graph `generate` signature on a prompt of 128
words of a stand-in vocabulary (`in_graph`: time per new token against
`TransformerXLCausalLM.generate` on the same text), and the model quantized to int8
(`quantize("int8")`) against float32 on one prompt (`int8`: both in one process, their calls
interleaved; also the bytes of the weights each holds), and the prompt feed (`prompts`: the
seconds of `generate(..., 1 new token)` on prompts of `PROMPT_LENGTHS` in turn, in one
process, tracing and compilation included; with `--baseline`, the baseline's package measured
by this script too, and the ratio of the sides' total seconds).
"""

import argparse
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import (emit, generation_counts, matmul_ceiling_gflops, random_ids, ratio_line, read_bandwidth_gbs,  # noqa: E402
                    run_rounds, run_worker)

SETTINGS = dict(mem_len=1600, clamp_len=1000, same_length=True, prompt=128)
MODES = ("greedy", "batch8", "beam4", "in_graph", "int8", "prompts")
PROMPT_LENGTHS = (1001, 1001, 901, 901, 130, 77, 1500)  # a length again, a new one, shorter than a segment


def per_token(run, short, long):
    """`(seconds per new token, fixed seconds per call)` from `run(new_tokens)`, best of two."""
    return side_by_side([run], short, long)[0]


def side_by_side(runs, short, long):
    """`per_token` of each of `runs`, their calls interleaved (a drift of the machine's speed
    falls on every side alike)."""
    times = [{} for _ in runs]
    for n in (short, long, short, long):
        for run, seen in zip(runs, times):
            start = time.perf_counter()
            run(n)
            seen[n] = min(seen.get(n, float("inf")), time.perf_counter() - start)
    steps = [(seen[long] - seen[short]) / (long - short) for seen in times]
    return [(step, seen[short] - short * step) for step, seen in zip(steps, times)]


def txl_worker(c, e):
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(2)
    tf.config.threading.set_inter_op_parallelism_threads(2)
    from common import model_config
    from txl_keras import TransformerXLLM
    from txl_keras.generate import generate
    from txl_keras.samplers import BeamSampler

    model = TransformerXLLM(model_config(c, dropout=0.0, mem_len=e["mem_len"], clamp_len=e["clamp_len"],
                                         same_length=e["same_length"]))
    prompt = random_ids(e["prompt"] + 1, c["n_token"], zipf=True).reshape(1, -1)
    mode = e["mode"]
    if mode == "in_graph":
        return in_graph_worker(model, c, e)
    if mode == "batch8":
        return batch_worker(model, c, e, generate)
    if mode == "int8":
        return int8_worker(model, prompt, generate)
    if mode == "prompts":
        return prompts_worker(model, c, generate)
    sampler = BeamSampler(4, 0.0) if mode == "beam4" else None
    start = time.perf_counter()  # the process's first call: its tracing and compilation included
    generate(model, prompt, e["short"], temperature=0, sampler=sampler)
    first_s = time.perf_counter() - start
    step, fixed = per_token(lambda n: generate(model, prompt, n, temperature=0, sampler=sampler),
                            e["short"], e["long"])
    result = {"s_per_token": step, "fixed_s": fixed, "first_s": first_s, "rows": len(prompt)}
    if sampler:
        result["beams"] = sampler.num_beams
    if mode == "greedy":  # the machine's ceilings, measured in the same process
        result.update(ceiling_gflops=matmul_ceiling_gflops(), bandwidth_gbs=read_bandwidth_gbs())
    return result


def batch_worker(model, c, e, generate, rounds=3):
    """A batch of 8 prompts of different lengths against one prompt at a time, side by side:
    each round measures both, their calls interleaved, and the ratio is the median of the
    rounds' ratios. The batch's prompts take ~5 s per call (8 lengths, each through the
    memory on its own), whose spread would swamp a per-token difference over a few tokens:
    the long calls make `batch_long` new tokens."""
    prompts = [random_ids(e["prompt"] + 1 - 8 * s, c["n_token"], seed=s, zipf=True) for s in range(8)]
    one = prompts[:1]
    batch, alone, ratios = [], [], []
    for _ in range(rounds):
        pair = side_by_side([lambda n: generate(model, one, n, temperature=0),
                             lambda n: generate(model, prompts, n, temperature=0)], e["short"], e["batch_long"])
        alone.append(pair[0])
        batch.append(pair[1])
        ratios.append(len(prompts) * alone[-1][0] / batch[-1][0])
    median = lambda values: float(np.median(values))  # noqa: E731
    return {"s_per_token": median([b[0] for b in batch]), "fixed_s": median([b[1] for b in batch]),
            "one_s_per_token": median([a[0] for a in alone]), "ratio": median(ratios),
            "ratios": ratios, "rows": len(prompts)}


def prompts_worker(model, c, generate):
    """The seconds of `generate(..., 1 new token)` on one prompt of each of `PROMPT_LENGTHS`
    in turn (their tracing and compilation included)."""
    seconds = []
    for n, length in enumerate(PROMPT_LENGTHS):
        prompt = random_ids(length, c["n_token"], seed=n, zipf=True).reshape(1, -1)
        start = time.perf_counter()
        generate(model, prompt, 1, temperature=0)
        seconds.append(time.perf_counter() - start)
    return {"prompt_s": seconds, "total_s": sum(seconds)}


def int8_worker(model, prompt, generate, rounds=5):
    """Greedy generation of the float32 model and of a copy quantized to int8, side by side:
    each round measures both, their calls interleaved; the ratio is the median of the
    rounds' ratios (the machine's speed drifts between rounds more than between the sides)."""
    from txl_keras import TransformerXLLM

    quantized = TransformerXLLM.from_config(model.get_config())
    quantized.set_weights(model.get_weights())
    quantized.quantize("int8")
    pairs = [side_by_side([lambda n: generate(model, prompt, n, temperature=0),
                           lambda n: generate(quantized, prompt, n, temperature=0)], 8, 40) for _ in range(rounds)]
    median = lambda values: float(np.median(values))  # noqa: E731
    nbytes = lambda m: sum(int(np.prod(w.shape)) * np.dtype(w.dtype).itemsize for w in m.weights)  # noqa: E731
    return {"s_per_token": median([q[0] for _, q in pairs]), "fixed_s": median([q[1] for _, q in pairs]),
            "float_s_per_token": median([f[0] for f, _ in pairs]),
            "ratios": [f[0] / q[0] for f, q in pairs], "ratio": median([f[0] / q[0] for f, q in pairs]),
            "weight_bytes": nbytes(quantized), "float_weight_bytes": nbytes(model), "rows": 1}


def in_graph_worker(model, c, e):
    """The exported `generate` signature against the task's generate, one prompt of words."""
    import tempfile

    import tensorflow as tf

    from tf_records.vocabulary import Vocabulary
    from txl_keras import TransformerXLCausalLM, TransformerXLCausalLMPreprocessor, TransformerXLTokenizer
    from txl_keras.export import export_saved_model

    vocab = Vocabulary([f"w{i}" for i in range(c["n_token"])])  # no end symbol: every token asked for is made
    text = " ".join(f"w{i}" for i in random_ids(e["prompt"] + 1, c["n_token"], zipf=True))
    folder = os.path.join(tempfile.mkdtemp(), "exported")
    export_saved_model(model, folder, vocab)
    served = tf.saved_model.load(folder)
    lm = TransformerXLCausalLM(model, TransformerXLCausalLMPreprocessor(TransformerXLTokenizer(vocab),
                                                                        model.config.tgt_len))

    def exported(n):
        served.generate(prompts=tf.constant([text]), max_new_tokens=tf.constant(n), temperature=tf.constant(0.0),
                        top_k=tf.constant(0), seed=tf.constant(0))

    def task(n):
        lm.generate(text, max_new_tokens=n, sampler="greedy")

    graph_step, graph_fixed = per_token(exported, e["short"], e["long"])
    task_step, task_fixed = per_token(task, e["short"], e["long"])
    return {"s_per_token": graph_step, "fixed_s": graph_fixed, "task_s_per_token": task_step,
            "task_fixed_s": task_fixed, "rows": 1}


def hf_worker(c, e):
    import torch
    from transformers import TransfoXLConfig, TransfoXLLMHeadModel

    torch.set_num_threads(2)
    config = TransfoXLConfig(vocab_size=c["n_token"], cutoffs=c["cutoffs"], d_model=c["d_model"],
                             d_embed=c["d_model"], n_head=c["n_head"], d_head=c["d_head"], d_inner=c["d_inner"],
                             n_layer=c["n_layer"], mem_len=e["mem_len"], clamp_len=e["clamp_len"],
                             same_length=e["same_length"], dropout=0.0, dropatt=0.0, adaptive=True,
                             div_val=c["div_val"], untie_r=c.get("untie_r", False))
    model = TransfoXLLMHeadModel(config).eval()
    prompt = torch.from_numpy(random_ids(e["prompt"] + 1, c["n_token"], zipf=True).astype("int64")).view(1, -1)

    def run(n):
        with torch.no_grad():
            mems = model(input_ids=prompt[:, :-1]).mems
            last = prompt[:, -1:]
            for _ in range(n):
                out = model(input_ids=last, mems=mems)
                mems, last = out.mems, out.logits[:, -1].argmax(-1, keepdim=True)

    step, fixed = per_token(run, e["short"], e["long"])
    return {"s_per_token": step, "fixed_s": fixed}


def print_ceilings(results, c, e):
    """Each side's model FLOP/s against the float32 matrix-product ceiling (MFU) and the
    bytes its steps must read against the read bandwidth, both measured in the greedy
    worker: generation reads every weight for a row or a few, so bandwidth is its ceiling."""
    greedy = results["greedy"]
    ceiling, bandwidth = greedy["ceiling_gflops"], greedy["bandwidth_gbs"]
    # the memory attended by the timed tokens: the prompt's rows, then one more per token
    memory = float(np.mean([min(e["mem_len"], e["prompt"] + k) for k in range(e["short"], e["long"])]))
    settings = {**c, "mem_len": e["mem_len"], "clamp_len": e["clamp_len"]}
    print(f"ceilings (greedy worker): float32 matmul {ceiling:.0f} GFLOP/s, read bandwidth {bandwidth:.1f} GB/s; "
          f"memory attended {memory:.0f} rows")
    for impl, r in results.items():
        if impl == "in_graph" or "prompt_s" in r:  # (another model: a stand-in vocabulary's; no steps)
            continue
        rows = r.get("beams", r.get("rows", 1))  # the rows each step computes
        flop, read = generation_counts(settings, memory, rows)
        gflops, gbs = rows * flop / r["s_per_token"] / 1e9, rows * read / r["s_per_token"] / 1e9
        print(f"{impl:>10}: {flop / 1e6:.0f} MFLOP and {read / 1e6:.0f} MB per new token; {gflops:.2f} GFLOP/s "
              f"(MFU {100 * gflops / ceiling:.2f}%), {gbs:.1f} GB/s ({100 * gbs / bandwidth:.0f}% of the read "
              "bandwidth)")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--impl", choices=["txl_keras", "hf"], help="run one worker (internal)")
    parser.add_argument("--hf_python", default=None)
    parser.add_argument("--baseline", default=None, help="a txl_keras checkout (another commit) run as a side")
    parser.add_argument("--short", type=int, default=8)
    parser.add_argument("--long", type=int, default=40)
    parser.add_argument("--batch_long", type=int, default=200, help="new tokens of batch8's long calls")
    parser.add_argument("--rounds", type=int, default=1, help="runs of every worker, the sides alternating")
    parser.add_argument("--config_json", help="the config itself (internal: main process -> workers)")
    parser.add_argument("--mode", default="greedy", choices=MODES, help="what a txl_keras worker runs (internal)")
    parser.add_argument("--modes", default=",".join(MODES), help="the txl_keras measurements to run, comma-separated")
    args = parser.parse_args()
    e = {**SETTINGS, "short": args.short, "long": args.long, "batch_long": args.batch_long, "mode": args.mode}
    if args.config_json:
        c = json.loads(args.config_json)
    else:
        from txl_keras.models.config import PRESETS

        c = {**PRESETS["wt103_base"], "dropout": 0.0, "mem_init": "zeros"}
    if args.impl:
        return emit((txl_worker if args.impl == "txl_keras" else hf_worker)(c, e))
    print(f"command: python bench/{os.path.basename(__file__)} " + " ".join(sys.argv[1:]))
    print(f"greedy generation, wt103_base, batch 1, {e}")
    forwarded = ["--config_json", json.dumps(c), f"--short={args.short}", f"--long={args.long}"]
    modes = [m for m in args.modes.split(",") if m]
    workers = [(m, lambda m=m: run_worker(sys.executable, __file__, ["--impl", "txl_keras", f"--mode={m}",
                                                                     f"--batch_long={args.batch_long}"] + forwarded))
               for m in modes]
    if args.baseline:
        script = os.path.join(os.path.abspath(args.baseline), "bench", os.path.basename(__file__))
        workers.append(("baseline", lambda: run_worker(sys.executable, script, ["--impl", "txl_keras"] + forwarded)))
    if args.baseline and "prompts" in modes:  # (this script, the baseline's package)
        packages = {"TXL_BENCH_PACKAGES": os.path.abspath(args.baseline)}
        workers.append(("baseline_prompts", lambda: run_worker(sys.executable, __file__, [
            "--impl", "txl_keras", "--mode=prompts"] + forwarded, env=packages)))
    rounds = run_rounds(args.rounds, workers)
    results = {name: min(runs, key=lambda r: r.get("s_per_token", r.get("total_s"))) for name, runs in rounds.items()}
    if args.hf_python:
        results["hf"] = run_worker(args.hf_python, __file__, ["--impl", "hf"] + forwarded)
    for impl, r in results.items():
        if "prompt_s" in r:
            print(f"{impl:>16}: prompts of {', '.join(map(str, PROMPT_LENGTHS))} tokens: "
                  f"{', '.join(f'{x:.2f}' for x in r['prompt_s'])} s; {r['total_s']:.2f} s in all")
            continue
        rows = r.get("rows", 1)
        print(f"{impl:>10}: {r['s_per_token'] * 1e3:.1f} ms per step ({rows} row{'s' if rows > 1 else ''}: "
              f"{rows / r['s_per_token']:.1f} tokens/s), {r['fixed_s']:.2f} s fixed per call"
              + (f", the process's first call {r['first_s']:.2f} s" if "first_s" in r else ""))
    greedy = results.get("greedy")
    if greedy:
        print_ceilings(results, c, e)
    if "batch8" in results:
        r = results["batch8"]
        print(f"batch of 8 prompts / one prompt at a time (tokens/s, same process, median of "
              f"{len(r['ratios'])} rounds: {', '.join(f'{x:.2f}' for x in r['ratios'])}): {r['ratio']:.2f}x "
              f"(one prompt {r['one_s_per_token'] * 1e3:.1f} ms per token)")
    if greedy and "beam4" in results:
        print(f"beam search, 4 beams / greedy (time per new token): "
              f"{results['beam4']['s_per_token'] / greedy['s_per_token']:.2f}x")
    if "in_graph" in results:
        r = results["in_graph"]
        print(f"in-graph generate signature: {r['s_per_token'] * 1e3:.1f} ms per new token, "
              f"TransformerXLCausalLM.generate {r['task_s_per_token'] * 1e3:.1f} ms: "
              f"{r['s_per_token'] / r['task_s_per_token']:.2f}x the time")
    if "int8" in results:
        r = results["int8"]
        print(f"int8 / float32 (greedy tokens/s, same process, median of {len(r['ratios'])} rounds: "
              f"{', '.join(f'{x:.2f}' for x in r['ratios'])}): {r['ratio']:.2f}x "
              f"(float32 {r['float_s_per_token'] * 1e3:.1f} ms per token); weights {r['weight_bytes'] / 1e6:.0f} MB, "
              f"float32's {r['float_weight_bytes'] / 1e6:.0f} MB ({r['weight_bytes'] / r['float_weight_bytes']:.3f}x)")
    if "baseline_prompts" in results:
        print(ratio_line("baseline (the prompt feed: 1 / the total seconds)",
                         [1 / r["total_s"] for r in rounds["prompts"]],
                         [1 / r["total_s"] for r in rounds["baseline_prompts"]]))
    if "baseline" in results and greedy:
        print(ratio_line("baseline", [1 / r["s_per_token"] for r in rounds["greedy"]],
                         [1 / r["s_per_token"] for r in rounds["baseline"]]))
    if "hf" in results and greedy:
        print(f"ratio txl_keras / hf (tokens/s): {results['hf']['s_per_token'] / greedy['s_per_token']:.2f}x")


if __name__ == "__main__":
    main()
