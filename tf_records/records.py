"""Token streams -> TFRecords laid out so every replica reads its own contiguous streams.

Layout. A split becomes `G = num_hosts * per_host_batch` streams. Training: the ids
(optionally `num_passes` rotated copies, as the original TPU data) are cut into `G`
equal streams, the remainder dropped. Evaluation: every token but the first is a
target exactly once; the streams share their boundary token and the last one is
padded with -1 targets (not scored). Each record holds one chunk of one host: the
int32 block `[per_host_batch, length + 1]` of its streams from time `t` on, so that
`inputs = block[:, :-1]` and `targets = block[:, 1:]`; chunks are `tgt_len` long, the
last evaluation chunk shorter. Host `h` owns streams `[h * B, (h + 1) * B)` and its own
file; replica `c` of a host with `C` cores owns rows `[c * B / C, (c + 1) * B / C)`.
"""

import hashlib
import json

import numpy as np
import tensorflow as tf

from txl_io import files

FORMAT = "txl_keras.records.v1"


def layout_name(split, per_host_batch, tgt_len, num_hosts):
    return f"{split}.bsz-{per_host_batch}.tlen-{tgt_len}.hosts-{num_hosts}"


def record_info_path(records_dir, split, per_host_batch, tgt_len, num_hosts):
    return files.join(records_dir, f"record_info-{layout_name(split, per_host_batch, tgt_len, num_hosts)}.json")


def make_streams(ids, num_streams, evaluation, num_passes=1, seed=0):
    """`(num_streams, length + 1)` int32 streams; row r's inputs are [:, :-1]."""
    if isinstance(ids, list):
        ids = np.concatenate(ids)
    ids = np.asarray(ids, np.int32)
    if evaluation:
        per_stream = -(-(len(ids) - 1) // num_streams)
        padded = np.full(num_streams * per_stream + 1, -1, np.int32)
        padded[: len(ids)] = ids
        index = np.arange(num_streams)[:, None] * per_stream + np.arange(per_stream + 1)[None]
        return padded[index]
    if num_passes > 1:
        rng = np.random.RandomState(seed)
        starts = rng.randint(0, len(ids), size=num_passes - 1)
        ids = np.concatenate([ids] + [np.roll(ids, -s) for s in starts])
    per_stream = len(ids) // num_streams
    if per_stream < 2:
        raise ValueError(
            f"The split has {len(ids)} tokens, too few for {num_streams} streams of at least 2 "
            "tokens; lower the batch size or the number of hosts."
        )
    return ids[: num_streams * per_stream].reshape(num_streams, per_stream)


def chunk_starts(stream_length, tgt_len, evaluation):
    """Chunk start times; training keeps only full chunks."""
    steps = stream_length - 1
    if evaluation:
        return list(range(0, steps, tgt_len))
    return list(range(0, steps - tgt_len + 1, tgt_len))


def _example(block):
    feature = {
        "block": tf.train.Feature(bytes_list=tf.train.BytesList(value=[block.astype("<i4").tobytes()])),
        "shape": tf.train.Feature(int64_list=tf.train.Int64List(value=list(block.shape))),
    }
    return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()


def _check_ids(flat, split, vocab_size):
    if vocab_size is not None and flat.size and (flat.min() < 0 or flat.max() >= vocab_size):
        raise ValueError(
            f"Token ids of the {split} split are outside [0, {vocab_size}) "
            f"(min {flat.min()}, max {flat.max()}); the vocabulary and the ids disagree."
        )


def _write_host_file(path, rows, starts, tgt_len):
    """One host's chunks, written whole (see txl_io.files); returns its byte size."""
    files.check_free_space(path, 2 * rows.nbytes + (1 << 20), f"the records {files.basename(path)}")
    files.remove_leftovers(files.dirname(path) or ".", {files.basename(path)})
    with files.local_output(path) as tmp, files.reporting(path):
        with tf.io.TFRecordWriter(tmp) as writer:
            for t in starts:
                writer.write(_example(rows[:, t: t + tgt_len + 1]))
    return files.size(path)


def write_split(ids, records_dir, split, per_host_batch, tgt_len, num_hosts=1, vocab_size=None,
                evaluation=None, num_passes=1, seed=0, dataset=None, vocab_fingerprint=None, log=print):
    """Write a split's records for one layout and return its record info (a dict);
    `vocab_fingerprint` (`Vocabulary.fingerprint()`) names the vocabulary the ids are of.

    Each file is written whole and the record info last (the commit marker), so an
    interrupted build leaves nothing that reads as complete; a rerun rebuilds only
    missing or damaged files.
    """
    if evaluation is None:
        evaluation = split != "train"
    for name, value in (("per_host_batch", per_host_batch), ("tgt_len", tgt_len), ("num_hosts", num_hosts)):
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise ValueError(f"Expected `{name}` to be a positive integer. Received: {name}={value}")
    flat = np.concatenate(ids) if isinstance(ids, list) else np.asarray(ids)  # concatenated once
    _check_ids(flat, split, vocab_size)
    streams = make_streams(flat, num_hosts * per_host_batch, evaluation, num_passes, seed)
    starts = chunk_starts(streams.shape[1], tgt_len, evaluation)
    if not starts:
        raise ValueError(
            f"The {split} split gives streams of {streams.shape[1]} tokens, shorter than "
            f"tgt_len={tgt_len} + 1; lower --tgt_len or the batch size."
        )
    base = layout_name(split, per_host_batch, tgt_len, num_hosts)
    info_path = record_info_path(records_dir, split, per_host_batch, tgt_len, num_hosts)
    fingerprint = hashlib.sha1(streams.tobytes()).hexdigest()
    entries = []
    for host in range(num_hosts):
        name = f"{base}.host-{host}.tfrecords"
        path = files.join(records_dir, name)
        rows = streams[host * per_host_batch: (host + 1) * per_host_batch]
        size = _previous_size(info_path, name, fingerprint)
        if size is None or not files.exists(path) or files.size(path) != size:
            size = _write_host_file(path, rows, starts, tgt_len)
            log(f"wrote {path} ({len(starts)} chunks of {rows.shape[0]} rows)")
        entries.append({"name": name, "host": host, "bytes": size})
    info = _record_info(streams, starts, split, per_host_batch, tgt_len, num_hosts, evaluation,
                        num_passes, vocab_size, dataset, fingerprint, entries)
    info["vocab_fingerprint"] = vocab_fingerprint
    files.atomic_write(info_path, json.dumps(info, indent=2))
    return info


def _record_info(streams, starts, split, per_host_batch, tgt_len, num_hosts, evaluation, num_passes,
                 vocab_size, dataset, fingerprint, entries):
    targets = streams[:, 1:]
    return {
        "format": FORMAT,
        "dataset": dataset,
        "split": split,
        "evaluation": bool(evaluation),
        "per_host_batch": per_host_batch,
        "tgt_len": tgt_len,
        "num_hosts": num_hosts,
        "num_streams": int(streams.shape[0]),
        "stream_length": int(streams.shape[1]),
        "num_batch": len(starts),
        "num_targets": int((targets >= 0).sum()) if evaluation else int(targets[:, : starts[-1] + tgt_len].size),
        "num_passes": num_passes,
        "vocab_size": vocab_size,
        "fingerprint": fingerprint,
        "files": entries,
    }


def _previous_size(info_path, name, fingerprint):
    """The byte size a finished earlier build of the same streams recorded for a file."""
    try:
        info = json.loads(files.read_text(info_path))
    except (OSError, ValueError):
        return None
    if info.get("fingerprint") != fingerprint:
        return None
    return next((f["bytes"] for f in info.get("files", []) if f["name"] == name), None)
