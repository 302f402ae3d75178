"""The memory estimates the programs check before they build a model, against the peak measured.

    python bench/memory_estimates.py [--cases=eval_b1,eval_b8,generate,beam4,score,export,train,train_long]

Each case runs in a fresh process what its program runs, on the bench's model
(`wt103_base`, random weights): the evaluation-only trainer (`Trainer.evaluate` on records
of its vocabulary, the paper's evaluation settings: tgt_len 128, mem_len 1600, clamp_len
1000) at batch 1 and 8; generation of 64 tokens (greedy, and beam search with 4 beams) and
scoring at mem_len 1600; export to a SavedModel; and two training steps of a wide model
(4 layers of d_model 1536, d_inner 6144, 256 symbols, 8 streams of 128 tokens) and of a
long one (4 layers of d_model 256, 16 streams of 512 tokens and 512 of memory). It prints
the peak resident memory above what the process held after importing txl_keras, next to
`sizes.inference_bytes` or `sizes.training_bytes` (what the programs check), and their
ratio: the estimate must be at least the peak (ratio >= 1) and at most 1.5 times it.
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
    "train": ("train", 8, dict(n_layer=4, d_model=1536, d_embed=1536, n_head=12, d_head=128, d_inner=6144,
                               n_token=256, cutoffs=[], div_val=1, tgt_len=128, mem_len=128)),
    "train_long": ("train", 16, dict(n_layer=4, d_model=256, d_embed=256, n_head=8, d_head=32, d_inner=1024,
                                     n_token=256, cutoffs=[], div_val=1, tgt_len=512, mem_len=512)),
}


def config_of(settings):
    from txl_keras.models.config import TransformerXLConfig

    return TransformerXLConfig.from_preset("wt103_base", **settings)


def estimate(kind, batch, settings):
    from txl_keras.models import sizes
    from txl_keras.training.evaluation import SCORE_TOKENS

    config = config_of(settings)
    if kind == "train":  # as the trainers check it
        return sizes.training_bytes(config, batch)
    if kind == "eval":  # as the evaluation-only trainer checks it
        return sizes.inference_bytes(config, batch, scored_tokens=max(SCORE_TOKENS, batch * config.tgt_len),
                                     compiled=True)
    if kind == "score":  # as python -m txl_keras.generate --score checks it
        return sizes.inference_bytes(config, 1)
    if kind == "export":  # as python -m txl_keras.export checks it
        return sizes.inference_bytes(config, 1) + sizes.EXPORT_BYTES
    return sizes.inference_bytes(config, batch, scored_tokens=batch, beam_search=kind == "beam")


def write_records(folder, config, batch, split):
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
    write_split(ids, folder, split, batch, config.tgt_len, vocab_size=config.n_token,
                vocab_fingerprint=vocab.fingerprint(), log=lambda *_: None)


def worker(kind, batch, settings):
    import numpy as np
    import tensorflow as tf

    import txl_keras  # noqa: F401 (the baseline is the process after importing the library)

    config = config_of(settings)
    with tempfile.TemporaryDirectory() as folder:
        if kind in ("eval", "train"):
            write_records(folder, config, batch, "train" if kind == "train" else "valid")
        baseline = current_rss_mb()
        from txl_keras.models import TransformerXLLM

        if kind == "train":
            from txl_keras.training import TrainConfig, Trainer

            tc = TrainConfig(model_dir=os.path.join(folder, "run"), records_dir=folder, train_batch_size=batch,
                             train_steps=2, iterations=1, save_steps=0)
            Trainer(tf.distribute.get_strategy(), config, tc, log=lambda *_: None).train()
        elif kind == "eval":
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
