import json
import os

import numpy as np
import pytest

from tf_records import load_record_info, stream_dataset, verify_records, write_split
from tf_records.dataset import distributed_dataset_fn

LAYOUTS = [  # (per_host_batch, num_hosts, num_core_per_host)
    (4, 1, 1), (4, 1, 2), (6, 2, 3), (8, 2, 4), (3, 3, 1),
]


def read_rows(info, num_core_per_host):
    """rows[host][replica][row] = (inputs, targets) concatenated over time."""
    per_replica = info["per_host_batch"] // num_core_per_host
    out = {}
    for host in range(info["num_hosts"]):
        batches = list(stream_dataset(info, host, num_core_per_host, repeat=False).as_numpy_iterator())
        assert len(batches) == info["num_batch"] * num_core_per_host
        for replica in range(num_core_per_host):
            mine = batches[replica::num_core_per_host]  # round-robin over replicas
            for row in range(per_replica):
                inputs = np.concatenate([b[0][row] for b in mine])
                targets = np.concatenate([b[1][row] for b in mine])
                out[(host, replica, row)] = (inputs, targets)
    return out


@pytest.mark.parametrize("batch,hosts,cores", LAYOUTS)
def test_training_streams_are_contiguous_per_replica(tmp_path, batch, hosts, cores):
    ids = np.arange(1000, dtype=np.int32) % 97
    tgt_len = 7
    info = write_split(ids, str(tmp_path), "train", batch, tgt_len, hosts, vocab_size=97, log=lambda *_: None)
    info = load_record_info(str(tmp_path), "train", batch, tgt_len, hosts)
    streams = hosts * batch
    per_stream = len(ids) // streams
    usable = (per_stream - 1) // tgt_len * tgt_len
    rows = read_rows(info, cores)
    for (host, replica, row), (inputs, targets) in rows.items():
        stream = host * batch + replica * (batch // cores) + row
        expected = ids[stream * per_stream: (stream + 1) * per_stream]
        np.testing.assert_array_equal(inputs, expected[:usable])
        np.testing.assert_array_equal(targets, expected[1: usable + 1])


@pytest.mark.parametrize("batch,hosts,cores", LAYOUTS)
def test_evaluation_scores_every_token_exactly_once(tmp_path, batch, hosts, cores):
    ids = (np.arange(503, dtype=np.int32) * 7) % 89
    info = write_split(ids, str(tmp_path), "valid", batch, 10, hosts, vocab_size=89, log=lambda *_: None)
    info = load_record_info(str(tmp_path), "valid", batch, 10, hosts)
    assert info["num_targets"] == len(ids) - 1
    rows = read_rows(info, cores)
    ordered = [rows[k] for k in sorted(rows, key=lambda k: (k[0], k[1], k[2]))]
    targets = np.concatenate([t for _, t in ordered])
    inputs = np.concatenate([i for i, _ in ordered])
    scored = targets >= 0
    np.testing.assert_array_equal(targets[scored], ids[1:])  # each once, in order
    np.testing.assert_array_equal(inputs[scored], ids[:-1])  # each with its true context
    # every chunk has the static length tgt_len: the end of the last one is padding,
    # inputs 0 and targets -1, and the padding is exactly what the streams lack
    dataset = stream_dataset(info, 0, cores)
    assert dataset.element_spec[0].shape.as_list() == [batch // cores, 10]
    batches = list(dataset.as_numpy_iterator())
    assert {b[0].shape[1] for b in batches} == {10}
    num_chunks = -(-(info["stream_length"] - 1) // 10)
    assert len(batches) == num_chunks * cores
    last_inputs, last_targets = batches[-1]
    pad = num_chunks * 10 - (info["stream_length"] - 1)
    assert (last_targets[:, last_targets.shape[1] - pad:] == -1).all()
    assert (last_inputs[:, 1:][last_targets[:, :-1] == -1] == 0).all()  # after a stream's end


def test_streams_run_no_autotuning_thread(tmp_path):
    """Deleting an iterator waits for tf.data's autotuning thread to wake from its sleep
    (seconds once the iterator has lived a while): an evaluation pass deletes its iterator
    at its end, and a trainer's stream goes when the trainer does, so no stream runs that
    thread."""
    ids = np.arange(200, dtype=np.int32) % 50
    for split in ("valid", "train"):
        write_split(ids, str(tmp_path), split, 2, 10, vocab_size=50, log=lambda *_: None)
    for split in ("valid", "train"):
        dataset = stream_dataset(load_record_info(str(tmp_path), split, 2, 10, 1))
        assert dataset.options().autotune.enabled is False


def test_num_passes_adds_rotated_copies(tmp_path):
    ids = np.arange(200, dtype=np.int32)
    info = write_split(ids, str(tmp_path), "train", 2, 5, num_passes=3, vocab_size=200, log=lambda *_: None)
    info = load_record_info(str(tmp_path), "train", 2, 5)
    tokens = np.concatenate([b[0].ravel() for b in stream_dataset(info, repeat=False).as_numpy_iterator()])
    assert info["stream_length"] == 300 and np.bincount(tokens, minlength=200).max() >= 3


def test_works_with_distribute_datasets_from_function(tmp_path, mirrored):
    strategy = mirrored
    replicas = strategy.num_replicas_in_sync
    ids = np.arange(400, dtype=np.int32)
    write_split(ids, str(tmp_path), "train", 4, 5, vocab_size=400, log=lambda *_: None)
    info = load_record_info(str(tmp_path), "train", 4, 5)
    dist = strategy.distribute_datasets_from_function(distributed_dataset_fn(info))
    first = next(iter(dist))
    locals_ = strategy.experimental_local_results(first[0])
    assert len(locals_) == replicas
    # the replicas together hold the first chunk of the 4 streams, in stream order
    np.testing.assert_array_equal(np.concatenate([x.numpy() for x in locals_])[:, 0], [0, 100, 200, 300])


def test_other_layout_is_refused_with_rebuild_hint(tmp_path):
    write_split(np.arange(300, dtype=np.int32), str(tmp_path), "train", 4, 5, vocab_size=300, log=lambda *_: None)
    with pytest.raises(ValueError, match=r"built for another layout.*--per_host_train_bsz=8 --tgt_len=5"):
        load_record_info(str(tmp_path), "train", 8, 5)
    info = load_record_info(str(tmp_path), "train", 4, 5)
    with pytest.raises(ValueError, match="3 replicas per host cannot share"):
        stream_dataset(info, num_core_per_host=3)
    with pytest.raises(ValueError, match="vocabulary of 300 tokens but the model has n_token=200"):
        stream_dataset(info, vocab_size=200)
    with pytest.raises(FileNotFoundError, match="No valid records"):
        load_record_info(str(tmp_path), "valid", 4, 5)


def test_truncated_and_corrupt_files_are_named(tmp_path):
    write_split(np.arange(3000, dtype=np.int32) % 10, str(tmp_path), "train", 4, 5, vocab_size=10,
                log=lambda *_: None)
    info = load_record_info(str(tmp_path), "train", 4, 5)
    path = os.path.join(str(tmp_path), info["files"][0]["name"])
    data = bytearray(open(path, "rb").read())
    data[len(data) // 2] ^= 0xFF  # flip a byte in the middle: the CRC no longer matches
    open(path, "wb").write(bytes(data))
    with pytest.raises(ValueError, match=f"Record file {path} is corrupt"):
        verify_records(load_record_info(str(tmp_path), "train", 4, 5))
    open(path, "wb").write(bytes(data[:-100]))
    with pytest.raises(ValueError, match=f"Record file {path} has .* bytes.*truncated"):
        load_record_info(str(tmp_path), "train", 4, 5)


def test_ids_outside_the_vocabulary_are_refused(tmp_path):
    with pytest.raises(ValueError, match=r"outside \[0, 10\)"):
        write_split(np.arange(20, dtype=np.int32), str(tmp_path), "train", 2, 3, vocab_size=10)


def test_interrupted_build_leaves_nothing_complete_and_rerun_finishes(tmp_path, monkeypatch):
    import tf_records.records as records

    ids = np.arange(2000, dtype=np.int32) % 10
    calls = {"n": 0}
    real = records._example

    def dying(block):
        calls["n"] += 1
        if calls["n"] == 50:
            raise KeyboardInterrupt("killed mid-file")
        return real(block)

    monkeypatch.setattr(records, "_example", dying)
    with pytest.raises(KeyboardInterrupt):
        write_split(ids, str(tmp_path), "train", 2, 4, num_hosts=2, vocab_size=10, log=lambda *_: None)
    leftovers = os.listdir(tmp_path)
    assert not any(name.startswith("record_info") for name in leftovers)
    assert not any(name.endswith(".partial") for name in leftovers)
    with pytest.raises(FileNotFoundError):
        load_record_info(str(tmp_path), "train", 2, 4, 2)
    monkeypatch.setattr(records, "_example", real)
    write_split(ids, str(tmp_path), "train", 2, 4, num_hosts=2, vocab_size=10, log=lambda *_: None)
    info = load_record_info(str(tmp_path), "train", 2, 4, 2)
    verify_records(info)
    written = []
    info2 = write_split(ids, str(tmp_path), "train", 2, 4, num_hosts=2, vocab_size=10, log=written.append)
    assert written == [] and info2["files"] == info["files"]  # a complete build is not redone
    assert json.load(open(os.path.join(str(tmp_path), "record_info-train.bsz-2.tlen-4.hosts-2.json")))["num_batch"]
