"""One corpus -> vocabulary, corpus info and the records of each split, in one folder."""

import json
import os

from txl_io import files
from tf_records.corpora import SPLITS, load_corpus
from tf_records.download import download
from tf_records.vocabulary import VOCAB_FILE

CORPUS_INFO_FILE = "corpus-info.json"


def default_records_dir(dataset):
    return os.path.join("data", dataset.replace(":", "_").replace("/", "_"))


def build_records(dataset, records_dir=None, data_dir=None, splits=SPLITS, per_host_train_bsz=60,
                  per_host_valid_bsz=60, per_host_test_bsz=0, tgt_len=70, num_hosts=1,
                  num_core_per_host=1, num_passes=1, do_download=False, log=print, **corpus_options):
    """Build (or finish building) everything a trainer needs; returns the records dir.

    `per_host_test_bsz=0` uses the validation batch size for the test split.
    """
    records_dir = records_dir or default_records_dir(dataset)
    files.check_access(records_dir)  # an unreachable bucket fails now, before any work
    if data_dir:
        files.check_access(data_dir)
    batches = {"train": per_host_train_bsz, "valid": per_host_valid_bsz,
               "test": per_host_test_bsz or per_host_valid_bsz}
    for split in splits:
        if split not in SPLITS:
            raise ValueError(f"Unknown split {split!r}; expected some of {SPLITS}.")
        if batches[split] % num_core_per_host:
            raise ValueError(
                f"per-host batch {batches[split]} of the {split} split is not divisible by "
                f"num_core_per_host={num_core_per_host}; every replica needs the same number of streams."
            )
    if do_download:
        download(dataset, data_dir, log=log)
    corpus = load_corpus(dataset, data_dir=data_dir, **corpus_options)
    with files.exclusive(records_dir, f"The records folder {records_dir}"):
        _write_splits(corpus, records_dir, splits, batches, tgt_len, num_hosts, num_passes, log)
    return records_dir


def _write_splits(corpus, records_dir, splits, batches, tgt_len, num_hosts, num_passes, log):
    from tf_records.records import write_split  # TensorFlow: imported when records are written

    _refuse_other_vocabulary(records_dir, corpus)
    for i, split in enumerate(splits):
        ids = corpus.split_ids[split]()
        _report_unknown(ids, corpus.vocab, split, log)
        files.check_free_space(records_dir, 8 * len(ids) + (1 << 20), f"the {split} records")
        if i == 0:  # the first split encodes: now the folder gets the vocabulary
            corpus.vocab.save(files.join(records_dir, VOCAB_FILE))
            files.atomic_write(files.join(records_dir, CORPUS_INFO_FILE), json.dumps(corpus.info(), indent=2))
        info = write_split(ids, records_dir, split, batches[split], tgt_len, num_hosts,
                           vocab_size=len(corpus.vocab), num_passes=num_passes if split == "train" else 1,
                           dataset=corpus.name, vocab_fingerprint=corpus.vocab.fingerprint(), log=log)
        log(f"{split}: {info['num_batch']} batches of {batches[split]} x {tgt_len}, "
            f"{info['num_targets']} targets -> {records_dir}")


def _refuse_other_vocabulary(records_dir, corpus):
    """Records of another vocabulary are never overwritten (their ids would change meaning)."""
    path = files.join(records_dir, VOCAB_FILE)
    if files.exists(path) and json.loads(files.read_text(path)) != json.loads(json.dumps(corpus.vocab.to_dict())):
        raise ValueError(f"{records_dir} holds records of another vocabulary ({path}); build into another "
                         "--records_dir (nothing was changed).")


# A vocabulary that maps more of a split than this to its unknown symbol does not fit the corpus.
MAX_UNKNOWN_SHARE = 0.5


def _report_unknown(ids, vocab, split, log):
    if vocab.unk_id is None or len(ids) == 0:
        return
    share = float((ids == vocab.unk_id).mean())
    if share > MAX_UNKNOWN_SHARE:
        raise ValueError(f"{share:.0%} of the {split} split's tokens are {vocab.unk_symbol}: the vocabulary does "
                         "not fit this corpus (another language, case, level or tokenisation?).")
    if share > 0.05:
        log(f"warning: {share:.1%} of the {split} split's tokens are {vocab.unk_symbol}")


def load_corpus_info(records_dir):
    """`{"dataset", "vocab_size", "cutoffs"}` of built records (cutoffs include 0 and V)."""
    path = files.join(records_dir, CORPUS_INFO_FILE)
    try:
        return json.loads(files.read_text(path))
    except ValueError as e:
        raise ValueError(f"{path} is corrupt ({e}); rebuild the records.") from None
    except FileNotFoundError:
        raise FileNotFoundError(
            f"No {CORPUS_INFO_FILE} in {records_dir}; build the records with `python -m tf_records`."
        ) from None
