"""The memory estimate of the programs that run frozen weights, against the peak measured.

    python bench/inference_memory.py [--cases=eval_b1,eval_b8,generate,beam4,score,export]

Each case runs in a fresh process what its program runs, on the bench's model
(`wt103_base`, random weights): the evaluation-only trainer (`Trainer.evaluate` on records
of its vocabulary, the paper's evaluation settings: tgt_len 128, mem_len 1600, clamp_len
1000) at batch 1 and 8; generation of 64 tokens (greedy, and beam search with 4 beams) and
scoring at mem_len 1600; export to a SavedModel. It prints the peak resident memory above
what the process held after importing txl_keras, next to `sizes.inference_bytes` (what
the programs check before they build the model), and their ratio: the estimate must be
at least the peak (ratio >= 1) and at most 1.5 times it.
"""

import argparse
import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import current_rss_mb, emit, peak_rss_mb, run_worker  # noqa: E402

EVAL = dict(tgt_len=128, mem_len=1600, clamp_len=1000)
CASES = {  # name: (what runs, batch, memory settings)
    "eval_b1": ("eval", 1, EVAL),
    "eval_b8": ("eval", 8, EVAL),
    "generate": ("generate", 1, dict(mem_len=1600)),
    "beam4": ("beam", 4, dict(mem_len=1600)),
    "score": ("score", 1, dict(mem_len=1600)),
    "export": ("export", 1, {}),
}


def config_of(settings):
    from txl_keras.models.config import TransformerXLConfig

    return TransformerXLConfig.from_preset("wt103_base", **settings)


def estimate(kind, batch, settings):
    from txl_keras.models import sizes
    from txl_keras.training.evaluation import SCORE_TOKENS

    config = config_of(settings)
    scored = SCORE_TOKENS if kind == "eval" else 0
    return sizes.inference_bytes(config, batch, scored_tokens=scored)


def write_records(folder, config, batch):
    """Records of random ids in a vocabulary of the model's size (what the trainer reads)."""
    import numpy as np

    from tf_records.records import write_split
    from tf_records.vocabulary import Vocabulary

    vocab = Vocabulary([f"w{i}" for i in range(config.n_token)], add_eos=True)
    vocab.save(os.path.join(folder, "vocab.json"))
    with open(os.path.join(folder, "corpus-info.json"), "w") as f:
        json.dump({"dataset": "wt103", "vocab_size": config.n_token,
                   "cutoffs": [0] + config.cutoffs + [config.n_token]}, f)
    ids = np.random.default_rng(0).integers(0, config.n_token, batch * config.tgt_len * 3 + 1)
    write_split(ids, folder, "valid", batch, config.tgt_len, vocab_size=config.n_token,
                vocab_fingerprint=vocab.fingerprint(), log=lambda *_: None)


def worker(kind, batch, settings):
    import numpy as np
    import tensorflow as tf

    import txl_keras  # noqa: F401 (the baseline is the process after importing the library)

    config = config_of(settings)
    with tempfile.TemporaryDirectory() as folder:
        if kind == "eval":
            write_records(folder, config, batch)
        baseline = current_rss_mb()
        from txl_keras.models import TransformerXLLM

        if kind == "eval":
            from txl_keras.training import TrainConfig, Trainer

            tc = TrainConfig(model_dir=os.path.join(folder, "run"), records_dir=folder, eval_batch_size=batch,
                             max_eval_batch=3)
            Trainer(tf.distribute.get_strategy(), config, tc, log=lambda *_: None).evaluate(progress=False,
                                                                                         summaries=False)
        else:
            model = TransformerXLLM(config)
            prompt = np.random.default_rng(0).integers(0, config.n_token, (batch if kind == "generate" else 1, 40))
            if kind in ("generate", "beam"):
                from txl_keras.generate import generate
                from txl_keras.samplers import BeamSampler, GreedySampler

                sampler = BeamSampler(batch) if kind == "beam" else GreedySampler()
                generate(model, prompt, 64, sampler=sampler)
            elif kind == "score":
                from txl_keras.generate import score

                score(model, np.random.default_rng(1).integers(0, config.n_token, (1, 4 * config.tgt_len)))
            else:
                from txl_keras.export import export_saved_model

                model(prompt[:, :2].astype("int32"))  # (built)
                export_saved_model(model, os.path.join(folder, "exported"))
    emit({"peak_mb": peak_rss_mb() - baseline})


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--worker", default=None)
    args = parser.parse_args()
    if args.worker:
        return worker(*json.loads(args.worker))
    print(f"{'case':<10} {'measured MB':>12} {'estimate MB':>12} {'estimate / measured':>20}")
    for name in args.cases.split(","):
        kind, batch, settings = CASES[name]
        result = run_worker(sys.executable, os.path.abspath(__file__),
                            ["--worker", json.dumps([kind, batch, settings])])
        guess = estimate(kind, batch, settings) / 2**20
        print(f"{name:<10} {result['peak_mb']:>12,.0f} {guess:>12,.0f} {guess / result['peak_mb']:>20.2f}",
              flush=True)


if __name__ == "__main__":
    main()
