"""TFRecords -> `tf.data` pipelines of per-replica `(inputs, targets)` stream batches."""

import json
import re

import tensorflow as tf

from txl_io import files
from tf_records.records import FORMAT, record_info_path
from tf_records.vocabulary import VOCAB_FILE, Vocabulary


def _rebuild_hint(split, per_host_batch, tgt_len, num_hosts):
    flag = {"train": "per_host_train_bsz", "valid": "per_host_valid_bsz", "test": "per_host_test_bsz"}
    return (
        f"Rebuild them with `python -m tf_records --{flag.get(split, 'per_host_train_bsz')}="
        f"{per_host_batch} --tgt_len={tgt_len} --num_hosts={num_hosts} ...` or start the trainer "
        "with the layout they were built for."
    )


def load_record_info(records_dir, split, per_host_batch, tgt_len, num_hosts=1):
    """The record info of a split built for this layout, with clear errors when the
    records are missing, were built for another layout, or are damaged."""
    path = record_info_path(records_dir, split, per_host_batch, tgt_len, num_hosts)
    if not files.exists(path):
        others = sorted(files.basename(p) for p in files.glob(files.join(records_dir, f"record_info-{split}.*.json")))
        if others:
            raise ValueError(
                f"The {split} records in {records_dir} were built for another layout ({others}); "
                f"this run needs per_host_batch={per_host_batch}, tgt_len={tgt_len}, "
                f"num_hosts={num_hosts}. " + _rebuild_hint(split, per_host_batch, tgt_len, num_hosts)
            )
        raise FileNotFoundError(
            f"No {split} records in {records_dir} (expected {files.basename(path)}). Build them "
            "with `python -m tf_records --dataset=... --records_dir=...`."
        )
    try:
        info = json.loads(files.read_text(path))
    except (ValueError, files.StorageError) as e:
        raise ValueError(f"The record info {path} is corrupt ({e}); rebuild the records.") from None
    if info.get("format") != FORMAT:
        raise ValueError(f"{path} is not a txl_keras record info (format {info.get('format')!r}).")
    for entry in info["files"]:
        file_path = files.join(records_dir, entry["name"])
        if not files.exists(file_path):
            raise FileNotFoundError(f"Record file {file_path} listed in {path} is missing; rebuild the records.")
        size = files.size(file_path)
        if size != entry["bytes"]:
            raise ValueError(
                f"Record file {file_path} has {size} bytes, not the {entry['bytes']} it was written "
                "with: it is truncated or damaged. Rebuild the records."
            )
    _check_vocabulary(info, path, records_dir)
    info["records_dir"] = records_dir
    return info


def _check_vocabulary(info, path, records_dir):
    """Records whose ids are of another vocabulary than the folder's vocab.json are refused."""
    vocab_path = files.join(records_dir, VOCAB_FILE)
    if not info.get("vocab_fingerprint") or not files.exists(vocab_path):
        return
    vocab = Vocabulary.load(vocab_path)
    if vocab.fingerprint() != info["vocab_fingerprint"]:
        raise ValueError(f"The records of {path} were built with another vocabulary than {vocab_path} (fingerprint "
                         f"{info['vocab_fingerprint']} against {vocab.fingerprint()}): their ids mean other "
                         "symbols. Rebuild the records into a new folder.")


def _parse(serialized):
    features = tf.io.parse_single_example(
        serialized,
        {"block": tf.io.FixedLenFeature([], tf.string), "shape": tf.io.FixedLenFeature([2], tf.int64)},
    )
    block = tf.io.decode_raw(features["block"], tf.int32)
    return tf.reshape(block, tf.cast(features["shape"], tf.int32))


def _check_layout(info, host_id, num_core_per_host, vocab_size):
    batch = info["per_host_batch"]
    if num_core_per_host <= 0 or batch % num_core_per_host:
        raise ValueError(
            f"The records hold {batch} streams per host, which {num_core_per_host} replicas per "
            "host cannot share equally. " + _rebuild_hint(info["split"], batch, info["tgt_len"], info["num_hosts"])
        )
    if not 0 <= host_id < info["num_hosts"]:
        raise ValueError(f"host_id={host_id} is outside the {info['num_hosts']} hosts the records were built for.")
    if vocab_size is not None and info.get("vocab_size") not in (None, vocab_size):
        raise ValueError(
            f"The records were built with a vocabulary of {info['vocab_size']} tokens but the model "
            f"has n_token={vocab_size}; build the model from the corpus info of these records."
        )


def stream_dataset(info, host_id=0, num_core_per_host=1, repeat=None, vocab_size=None, skip=0):
    """Per-replica batches of one host, in the order tf.distribute hands them out.

    Yields `(inputs, targets)` int32 `[per_host_batch // num_core_per_host, tgt_len]`:
    for each chunk, replica 0's rows, then replica 1's, ... (`distribute_datasets_
    from_function` gives consecutive elements to consecutive replicas). Concatenating
    one replica row's batches over time gives back its stream. Evaluation targets are -1
    where there is nothing to score (padding, including the end of the last chunk);
    inputs there are 0.

    Args:
        info: a record info from `load_record_info`.
        host_id: which host's share to read.
        num_core_per_host: replicas on this host; must divide `per_host_batch`.
        repeat: loop forever; default: for training records.
        vocab_size: if given, the records must have been built with this vocabulary size.
        skip: chunks already consumed (a resumed run's step), skipped so the run
            continues exactly where it stopped.
    """
    _check_layout(info, host_id, num_core_per_host, vocab_size)
    batch = info["per_host_batch"]
    entry = next(f for f in info["files"] if f["host"] == host_id)
    path = files.join(info["records_dir"], entry["name"])
    per_replica = batch // num_core_per_host
    ds = tf.data.TFRecordDataset(path).map(_parse)
    if repeat if repeat is not None else not info["evaluation"]:
        ds = ds.repeat()
        skip = skip % info["num_batch"]
    if skip:
        ds = ds.skip(skip)

    length = info["tgt_len"] + 1

    def split_replicas(block):
        # Static shapes (one trace, and slices/splits the graph can plan): the last,
        # shorter evaluation chunk is padded with -1 targets, which are not scored.
        if info["evaluation"]:
            block = tf.pad(block, [[0, 0], [0, length - tf.shape(block)[1]]], constant_values=-1)
        block = tf.reshape(block, [num_core_per_host, per_replica, length])
        inputs, targets = block[:, :, :-1], block[:, :, 1:]
        return tf.data.Dataset.from_tensor_slices((tf.maximum(inputs, 0), targets))

    ds = ds.flat_map(split_replicas)
    # Without autotuning: deleting an iterator waits for tf.data's autotuning thread to wake
    # from its sleep (10 ms, doubling), seconds for an iterator that lived a while (an
    # evaluation pass, a trainer's stream). Parsing a batch is microseconds, so a fixed
    # prefetch keeps the steps fed as well.
    options = tf.data.Options()
    options.autotune.enabled = False
    return ds.prefetch(2).with_options(options)


def distributed_dataset_fn(info, num_core_per_host=None, repeat=None, vocab_size=None, skip=0):
    """A function for `strategy.distribute_datasets_from_function`: each input pipeline
    (host) reads its own share; the strategy's layout must match the records'."""

    def dataset_fn(context):
        hosts = context.num_input_pipelines
        cores = num_core_per_host or context.num_replicas_in_sync // hosts
        if hosts != info["num_hosts"] or hosts * cores != context.num_replicas_in_sync:
            raise ValueError(
                f"The records were built for {info['num_hosts']} hosts but this run has {hosts} "
                f"input pipelines and {context.num_replicas_in_sync} replicas. "
                + _rebuild_hint(info["split"], info["per_host_batch"], info["tgt_len"], hosts)
            )
        return stream_dataset(info, context.input_pipeline_id, cores, repeat, vocab_size, skip)

    return dataset_fn


def verify_records(info):
    """Read every record once; a corrupt file raises an error that names it."""
    for entry in info["files"]:
        path = files.join(info["records_dir"], entry["name"])
        count = 0
        try:
            for _ in tf.data.TFRecordDataset(path).map(_parse):
                count += 1
        except (tf.errors.DataLossError, tf.errors.InvalidArgumentError) as e:
            reason = re.sub(r"\{\{.*?\}\}\s*|\s*\[Op:.*$", "", e.message.splitlines()[0])
            raise ValueError(f"Record file {path} is corrupt ({reason}); rebuild the records.") from None
        if count != info["num_batch"]:
            raise ValueError(f"Record file {path} holds {count} chunks, not {info['num_batch']}; rebuild the records.")
