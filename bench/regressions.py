"""Every row of the README's benchmark table (and two released models' sizes), this checkout
against a baseline commit.

    python bench/regressions.py --baseline=33e9868           # a commit: checked out beside, then removed
    python bench/regressions.py --baseline=../other-checkout  # or a checkout of it
    python bench/regressions.py --baseline=HEAD~1 --rows=generation,eval_char_small

Each row runs its benchmark script with `--baseline`: both sides in fresh processes, their
rounds alternating (`common.run_rounds`). The ratio of a row is ours over the baseline's
tokens/s, the median of the rounds' ratios where there are several. Prints every row's
ratio, then the rows that lost more than `--tolerance` (5%), and exits 1 if there is one.
Run it before landing a change to `txl_keras/layers`, `txl_keras/kernels`,
`txl_keras/training`, `txl_keras/generate` or `txl_keras/samplers.py`.
"""

import argparse
import os
import re
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# (name, script, its arguments): the README's benchmark rows, the txl_keras side
ROWS = [
    ("train_word_50k", "train_throughput.py", ["--config=word_50k", "--rounds=4", "--steps=8"]),
    ("train_word_50k_bf16", "train_throughput.py", ["--config=word_50k", "--rounds=2", "--steps=8",
                                                    "--precision=mixed_bfloat16"]),
    ("train_char_small", "train_throughput.py", ["--rounds=2"]),
    ("eval_wt103_batch8", "eval_throughput.py", ["--model=wt103_base", "--rounds=2"]),
    ("eval_wt103_batch1", "eval_throughput.py", ["--model=wt103_base", "--batch=1", "--segments=20", "--rounds=2"]),
    ("eval_char_small", "eval_throughput.py", ["--rounds=2", "--lengths="]),
    ("eval_wt103_large", "eval_throughput.py", ["--model=wt103_large", "--rounds=2", "--lengths="]),
    ("eval_lm1b_large", "eval_throughput.py", ["--model=lm1b_large", "--rounds=2", "--lengths="]),
    ("generation", "generate_throughput.py", ["--modes=greedy", "--rounds=3"]),
]
RATIO = re.compile(r"^ratio txl_keras / baseline[^:]*: ([0-9.]+)x(?:.*median ([0-9.]+)x)?", re.M)


def ratio_of(output):
    """Ours / the baseline from a script's output: the median of the rounds, else the one ratio."""
    found = RATIO.search(output)
    if not found:
        raise RuntimeError(f"no baseline ratio in the output:\n{output[-2000:]}")
    return float(found.group(2) or found.group(1))


def checkout(revision, folder):
    """A detached worktree of `revision` in `folder` (an unknown revision: one clear error)."""
    result = subprocess.run(["git", "-C", ROOT, "worktree", "add", "--detach", folder, revision],
                            capture_output=True, text=True)
    if result.returncode:
        sys.exit(f"error: cannot check out --baseline={revision}: {result.stderr.strip().splitlines()[-1]}")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--baseline", required=True, help="a commit of this repository, or a checkout's folder")
    parser.add_argument("--rows", default=",".join(name for name, _, _ in ROWS),
                        help="the rows to run, comma-separated")
    parser.add_argument("--tolerance", type=float, default=0.05, help="the loss that counts as a regression")
    args = parser.parse_args()
    rows = [r for r in args.rows.split(",") if r]
    unknown = sorted(set(rows) - {name for name, _, _ in ROWS})
    if unknown:
        sys.exit(f"error: unknown --rows {unknown}; the rows are {[name for name, _, _ in ROWS]}")
    if not 0 <= args.tolerance < 1:
        sys.exit(f"error: --tolerance={args.tolerance} must be in [0, 1)")
    with tempfile.TemporaryDirectory() as scratch:
        baseline = args.baseline
        if not os.path.isdir(baseline):
            baseline = os.path.join(scratch, "baseline")
            checkout(args.baseline, baseline)
        try:
            ratios = {}
            for name, script, arguments in (row for row in ROWS if row[0] in rows):
                command = [sys.executable, os.path.join(ROOT, "bench", script), *arguments,
                           f"--baseline={os.path.abspath(baseline)}"]
                result = subprocess.run(command, capture_output=True, text=True, cwd=ROOT)
                if result.returncode:
                    sys.exit(f"error: {name} failed:\n{result.stderr[-3000:]}")
                ratios[name] = ratio_of(result.stdout)
                print(f"{name:>20}: {ratios[name]:.2f}x the baseline ({' '.join(command[1:])})", flush=True)
        finally:
            if baseline != args.baseline:
                subprocess.run(["git", "-C", ROOT, "worktree", "remove", "--force", baseline], capture_output=True)
    lost = {name: r for name, r in ratios.items() if r < 1 - args.tolerance}
    print(f"rows that lost more than {args.tolerance:.0%} against {args.baseline}: "
          + (", ".join(f"{name} ({r:.2f}x)" for name, r in lost.items()) or "none"))
    sys.exit(1 if lost else 0)


if __name__ == "__main__":
    main()
