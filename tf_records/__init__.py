"""Corpora -> vocabularies -> TFRecords -> per-replica stream datasets.

Build records with `python -m tf_records --dataset=NAME ...`; read them back with
`load_record_info` and `stream_dataset` / `distributed_dataset_fn`.
"""

from txl_io import startup

startup.quiet_tensorflow()  # before TensorFlow is first imported

from tf_records.build import build_records, load_corpus_info  # noqa: E402
from tf_records.corpora import Corpus, load_corpus  # noqa: E402
from tf_records.dataset import distributed_dataset_fn, load_record_info, stream_dataset, verify_records  # noqa: E402
from tf_records.records import write_split  # noqa: E402
from tf_records.vocabulary import Vocabulary  # noqa: E402

__all__ = [
    "Corpus",
    "Vocabulary",
    "build_records",
    "distributed_dataset_fn",
    "load_corpus",
    "load_corpus_info",
    "load_record_info",
    "stream_dataset",
    "verify_records",
    "write_split",
]
