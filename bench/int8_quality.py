"""What int8 weights cost in quality: a `wt103_base`-sized model trained briefly on local text,
scored on held-out text with float32 and with int8 weights (`quantize("int8")`).

    python bench/int8_quality.py [--steps=150] [--megabytes=4]

The text is the Python standard library's sources (read from this interpreter's library,
sorted by path): the first 90% trains, the last 10% is held out. The vocabulary is its words
seen at least twice (at most 60,000; the rest `<unk>`), the model `wt103_base`'s layers
(16 x 410, 10 heads, inner 2,100, segments and memory of 150) with an adaptive softmax cut
at 20,000 and 40,000. After `--steps` steps of `fit` (batch 8), the held-out text is scored
through the memory on TensorFlow, float32 and int8, and then, from the saved preset, on JAX.
Printed: each side's perplexity, their ratio, and the per-token log-probabilities' mean and
largest absolute difference (nats).
"""

import argparse
import collections
import glob
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import ROOT, emit  # noqa: E402


def corpus(megabytes):
    files = sorted(glob.glob(os.path.join(os.path.dirname(os.__file__), "**", "*.py"), recursive=True))
    text, size = [], 0
    for path in files:
        if "site-packages" in path:
            continue
        with open(path, encoding="utf-8", errors="replace") as f:
            text.append(f.read())
        size += len(text[-1])
        if size >= megabytes * 2**20:
            break
    text = "".join(text)
    cut = int(len(text) * 0.9)
    return text[:cut], text[cut:]


def sides(lm, held):
    """`{"float32": NLL per token, "int8": ...}` of the held-out text, through the memory."""
    from txl_keras import TransformerXLCausalLM, TransformerXLLM
    from txl_keras.generate import score

    ids = np.asarray(lm.tokenizer(held))[None]
    quantized = TransformerXLLM.from_config({**lm.model.get_config(), "quantization": None})
    quantized.set_weights(lm.model.get_weights())
    quantized.quantize("int8")
    assert isinstance(lm, TransformerXLCausalLM)
    return {name: np.asarray(score(model, ids))[0].astype(np.float64)
            for name, model in (("float32", lm.model), ("int8", quantized))}


def jax_worker(preset, held_path):
    from txl_keras import TransformerXLCausalLM

    with open(held_path) as f:
        held = f.read()
    return {k: v.tolist() for k, v in sides(TransformerXLCausalLM.from_preset(preset), held).items()}


def report(backend, nll):
    f, q = np.asarray(nll["float32"]), np.asarray(nll["int8"])
    ppl_f, ppl_q = np.exp(f.mean()), np.exp(q.mean())
    print(f"{backend:>10}: perplexity float32 {ppl_f:.3f}, int8 {ppl_q:.3f} ({100 * (ppl_q / ppl_f - 1):+.3f}%); "
          f"per-token log-probability difference mean {np.abs(q - f).mean():.4f}, largest {np.abs(q - f).max():.4f} "
          f"nats over {len(f)} tokens")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--megabytes", type=float, default=4.0)
    parser.add_argument("--jax_worker", nargs=2, help="(internal) a preset and the held-out text's file")
    args = parser.parse_args()
    if args.jax_worker:
        return emit(jax_worker(*args.jax_worker))
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    from tf_records.vocabulary import Vocabulary
    from txl_keras import (TransformerXLCausalLM, TransformerXLCausalLMPreprocessor, TransformerXLConfig,
                           TransformerXLLM, TransformerXLTokenizer)

    print(f"command: python bench/{os.path.basename(__file__)} " + " ".join(sys.argv[1:]))
    train, held = corpus(args.megabytes)
    counts = collections.Counter(train.split())
    words = ["<unk>", "<eos>"] + [w for w, n in counts.most_common(60000) if n >= 2 and w not in ("<unk>", "<eos>")]
    vocab = Vocabulary(words, level="word", add_eos=True, unk_symbol="<unk>")
    config = TransformerXLConfig.from_preset("wt103_base", n_token=len(vocab), dropout=0.1,
                                             cutoffs=[c for c in (20000, 40000) if c < len(vocab) - 1],
                                             dropatt=0.0)
    lm = TransformerXLCausalLM(TransformerXLLM(config),
                               TransformerXLCausalLMPreprocessor(TransformerXLTokenizer(vocab), config.tgt_len))
    print(f"{len(train) / 2**20:.1f} MB to train on, {len(held) / 2**20:.2f} MB held out, {len(vocab)} words, "
          f"{lm.model.count_params() / 1e6:.1f}M parameters, {args.steps} steps of batch 8")
    lm.compile()
    lm.fit(train, batch_size=8, epochs=1, steps_per_epoch=args.steps, verbose=0)
    report("tensorflow", sides(lm, held))
    folder = tempfile.mkdtemp()
    lm.save_to_preset(os.path.join(folder, "preset"))
    with open(os.path.join(folder, "held.txt"), "w") as f:
        f.write(held)
    env = {**os.environ, "KERAS_BACKEND": "jax", "JAX_PLATFORMS": "cpu"}
    done = subprocess.run([sys.executable, __file__, "--jax_worker", os.path.join(folder, "preset"),
                           os.path.join(folder, "held.txt")], capture_output=True, text=True, env=env, cwd=ROOT)
    if done.returncode:
        sys.exit(done.stderr[-2000:])
    result = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")][-1]
    report("jax", json.loads(result[len("RESULT "):]))


if __name__ == "__main__":
    main()
