"""Corpora -> vocabularies -> TFRecords -> per-replica stream datasets.

Build records with `python -m tf_records --dataset=NAME ...`; read them back with
`load_record_info` and `stream_dataset` / `distributed_dataset_fn`. Importing the package
imports nothing heavy: each name below loads its module (and TensorFlow, where that module
uses it) on first use.
"""

from txl_io.lazy_names import lazy_names

# public name -> the module that holds it
_HOMES = {
    "Corpus": "tf_records.corpora",
    "Vocabulary": "tf_records.vocabulary",
    "build_records": "tf_records.build",
    "distributed_dataset_fn": "tf_records.dataset",
    "load_corpus": "tf_records.corpora",
    "load_corpus_info": "tf_records.build",
    "load_record_info": "tf_records.dataset",
    "stream_dataset": "tf_records.dataset",
    "verify_records": "tf_records.dataset",
    "write_split": "tf_records.records",
}

__getattr__, __dir__, __all__ = lazy_names(__name__, _HOMES)
