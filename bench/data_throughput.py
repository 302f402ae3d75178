"""Input pipeline throughput: building records (MB/s of corpus text) and reading them back
(tokens/s), next to what a training step consumes.

    python bench/data_throughput.py

Builds the default corpus (the standard library's sources, no download) at byte level
into a temporary folder, then times reading the training records with the reader the
trainers use.
"""

import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402,F401  (puts the project on the path)

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def main():
    from tf_records import build_records, load_record_info, stream_dataset
    from tf_records.corpora import load_corpus

    max_bytes = 8_000_000
    out = tempfile.mkdtemp()
    start = time.perf_counter()
    build_records("stdlib", out, max_bytes=max_bytes, tgt_len=128, per_host_train_bsz=16,
                  per_host_valid_bsz=16, log=lambda *_: None)
    build_s = time.perf_counter() - start
    corpus_chars = sum(len(load_corpus("stdlib", max_bytes=max_bytes).split_ids[s]()) for s in ("train", "valid", "test"))
    info = load_record_info(out, "train", 16, 128)
    rates = []
    for cores in (1, 2):
        start, tokens = time.perf_counter(), 0
        for inputs, _ in stream_dataset(info, num_core_per_host=cores, repeat=False):
            tokens += int(inputs.shape[0] * inputs.shape[1])
        rates.append((cores, tokens / (time.perf_counter() - start)))
    print("command: python bench/data_throughput.py")
    print(f"build (stdlib, {corpus_chars / 1e6:.1f} M tokens, byte level, 3 splits): "
          f"{corpus_chars / 1e6 / build_s:.1f} MB/s of corpus ({build_s:.1f} s)")
    for cores, rate in rates:
        print(f"read train records, {cores} replica(s): {rate:,.0f} tokens/s")
    print("a training step of the char-small config consumes about 2,000 tokens/s on this CPU "
          "(bench/train_throughput.py): reading is that many times faster: "
          f"{min(r for _, r in rates) / 2000:,.0f}x")


if __name__ == "__main__":
    main()
