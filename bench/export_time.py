"""Seconds to export a SavedModel with its text signatures (`export_saved_model`), this
checkout against another (`--baseline=DIR`), side by side: each export in a fresh process,
the two sides alternating.

    python bench/export_time.py --baseline=../txl_keras-other-commit --rounds=3

The model is built and called once before the clock starts; what is timed is the export:
tracing every signature (the memory ones, encode/decode, the whole generation loop) and
writing the folder. `--config` is a preset name (default `tiny`, here with `--n_token` 40
words and no clusters).
"""

import argparse
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import emit, ratio_line, run_rounds, run_worker  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def worker(args):
    sys.path.insert(0, args.root)
    import numpy as np

    from tf_records.vocabulary import Vocabulary
    from txl_keras import TransformerXLConfig, TransformerXLLM
    from txl_keras.export import export_saved_model

    config = TransformerXLConfig.from_preset(args.config, n_token=args.n_token, cutoffs=[])
    model = TransformerXLLM(config)
    model(np.zeros((1, 4), "int32"))
    vocabulary = Vocabulary(["<eos>", "<unk>"] + [f"w{i}" for i in range(args.n_token - 2)], level="word",
                            add_eos=True, unk_symbol="<unk>")
    with tempfile.TemporaryDirectory() as folder:
        start = time.perf_counter()
        export_saved_model(model, os.path.join(folder, "exported"), vocabulary)
        emit({"seconds": time.perf_counter() - start})


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--baseline", default=None, help="a txl_keras checkout (another commit) run as a side")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--config", default="tiny")
    parser.add_argument("--n_token", type=int, default=40)
    parser.add_argument("--worker", action="store_true", help="(internal) one timed export")
    parser.add_argument("--root", default=ROOT, help="(internal) the checkout a worker imports")
    args = parser.parse_args()
    if args.worker:
        return worker(args)

    def side(root):
        arguments = ["--worker", "--root", root, "--config", args.config, "--n_token", str(args.n_token)]
        return lambda: run_worker(sys.executable, os.path.abspath(__file__), arguments,
                                  env={"TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONPATH": root})

    sides = [("txl_keras", side(ROOT))]
    if args.baseline:
        sides.append(("baseline", side(os.path.abspath(args.baseline))))
    seconds = {name: [r["seconds"] for r in runs] for name, runs in run_rounds(args.rounds, sides).items()}
    print(f"command: python bench/{os.path.basename(__file__)} " + " ".join(sys.argv[1:]))
    for name, values in seconds.items():
        print(f"{name:>10}: export seconds {' / '.join(f'{v:.2f}' for v in values)} (best {min(values):.2f})")
    if args.baseline:  # (exports per second, so that above 1x is faster)
        print(ratio_line("baseline", [1 / v for v in seconds["txl_keras"]], [1 / v for v in seconds["baseline"]]))


if __name__ == "__main__":
    main()
