"""Corpora -> vocabularies -> TFRecords -> per-replica stream datasets.

Build records with `python -m tf_records --dataset=NAME ...`; read them back with
`load_record_info` and `stream_dataset` / `distributed_dataset_fn`. Importing the package
imports nothing heavy: each name below loads its module (and TensorFlow, where that module
uses it) on first use.
"""

import importlib

_HOMES = {
    "Corpus": "corpora",
    "Vocabulary": "vocabulary",
    "build_records": "build",
    "distributed_dataset_fn": "dataset",
    "load_corpus": "corpora",
    "load_corpus_info": "build",
    "load_record_info": "dataset",
    "stream_dataset": "dataset",
    "verify_records": "dataset",
    "write_split": "records",
}

__all__ = sorted(_HOMES)


def __getattr__(name):
    if name in _HOMES:
        return getattr(importlib.import_module(f"tf_records.{_HOMES[name]}"), name)
    raise AttributeError(f"module 'tf_records' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(__all__))
