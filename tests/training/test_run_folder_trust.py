"""What a run folder's files say is data: damaged or edited indexes and records never
decide what is deleted, never restart a run from step 0, and every file that existed is
still there afterwards (snapshots before and after)."""

import json
import os

import numpy as np
import pytest
from helpers import build, make, snapshot

from txl_io import files
from txl_keras import TransformerXLConfig, run_folder
from txl_keras.models import sizes


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A run folder with checkpoints at steps 2, 4 and 6, and its records."""
    root = tmp_path_factory.mktemp("trained")
    records = build(str(root))
    trainer = make(root, records, model_dir="run", save_steps=2, train_steps=6)
    trainer.train()
    assert [s for s, _ in run_folder.list_checkpoints(str(root / "run"))] == [2, 4, 6]
    return root, records


def copy_of(trained, tmp_path, name="run"):
    import shutil

    root, records = trained
    target = str(tmp_path / name)
    shutil.copytree(os.path.join(str(root), "run"), target)
    return target, records


BEST_RECORDS = {  # what a damaged or edited best.json says
    "weights .": {"step": 20, "loss": 1e9, "weights": "."},
    "weights empty": {"step": 20, "loss": 1e9, "weights": ""},
    "weights outside": {"step": 20, "loss": 1e9, "weights": "../outside.txt"},
    "weights a checkpoint folder": {"step": 20, "loss": 1e9, "weights": "ckpt-00000006"},
    "loss a string": {"step": 20, "loss": "low", "weights": "best-00000020.weights.h5"},
    "not an object": [1, 2, 3],
    "not JSON": "{oops",
}


@pytest.mark.parametrize("name", sorted(BEST_RECORDS))
def test_an_edited_best_record_deletes_nothing_and_starts_a_new_record(trained, tmp_path, name, capsys):
    model_dir, records = copy_of(trained, tmp_path)
    outside = tmp_path / "outside.txt"
    outside.write_text("the user's file")
    record = BEST_RECORDS[name]
    with open(os.path.join(model_dir, run_folder.BEST), "w") as f:
        f.write(record if isinstance(record, str) else json.dumps(record))
    before = snapshot(str(tmp_path))
    trainer = make(tmp_path, records, model_dir="run", eval_steps=2)
    trainer.restore_or_warm_start()
    trainer.evaluate_and_keep_best(6)
    after = snapshot(str(tmp_path))
    kept = {k: v for k, v in before.items() if k != os.path.join("run", run_folder.BEST)}
    assert {k: after.get(k) for k in kept} == kept  # every file as it was
    assert after[os.path.join("run", run_folder.BEST + ".damaged")] == before[os.path.join("run", run_folder.BEST)]
    best = run_folder.read_best(model_dir)
    assert best["weights"] == "best-00000006.weights.h5" and best["step"] == 6
    assert f"{os.path.join(model_dir, run_folder.BEST)} is damaged" in capsys.readouterr().err


def test_a_new_best_replaces_only_the_file_the_record_names(trained, tmp_path):
    model_dir, records = copy_of(trained, tmp_path)
    trainer = make(tmp_path, records, model_dir="run", eval_steps=2)
    trainer.restore_or_warm_start()
    first = run_folder.save_best(model_dir, trainer.model, 4, {"loss": 2.0})
    second = run_folder.save_best(model_dir, trainer.model, 6, {"loss": 1.0})
    assert not os.path.exists(first) and os.path.exists(second)
    assert sorted(n for n in os.listdir(model_dir) if n.startswith("best")) == ["best-00000006.weights.h5",
                                                                                 "best.json"]


@pytest.mark.parametrize("index", [
    {"checkpoints": ["ckpt-00000006", "ckpt-00000099"]},  # a folder that is not there
    {"checkpoints": "ckpt-00000006"},                     # a string, not a list
    {"checkpoints": ["../ckpt-00000006"]},                # not a name this program writes
    "not JSON {",
])
def test_a_damaged_index_is_rebuilt_from_the_checkpoints_on_disk(trained, tmp_path, index, capsys):
    """Never a silent restart from step 0: the run resumes from the newest checkpoint on
    disk, with a warning naming the index, and no checkpoint is overwritten."""
    model_dir, records = copy_of(trained, tmp_path)
    with open(os.path.join(model_dir, run_folder.INDEX), "w") as f:
        f.write(index if isinstance(index, str) else json.dumps(index))
    before = snapshot(model_dir)
    assert [s for s, _ in run_folder.list_checkpoints(model_dir)] == [2, 4, 6]
    trainer = make(tmp_path, records, model_dir="run", save_steps=2, train_steps=8)
    assert trainer.restore_or_warm_start() and int(trainer.step.numpy()) == 6
    assert f"the checkpoint index {os.path.join(model_dir, run_folder.INDEX)} is damaged" in capsys.readouterr().err
    trainer.train()
    after = snapshot(model_dir)
    for name in ("ckpt-00000004", "ckpt-00000006"):  # kept, and not rewritten
        for file in (run_folder.WEIGHTS, run_folder.STATE):
            assert after[os.path.join(name, file)] == before[os.path.join(name, file)]
    assert json.loads(after[run_folder.INDEX])["checkpoints"][-1] == "ckpt-00000008"


def test_another_models_state_is_named_and_the_checkpoint_before_it_used(trained, tmp_path, capsys):
    model_dir, records = copy_of(trained, tmp_path)
    newest = os.path.join(model_dir, "ckpt-00000006", run_folder.STATE)
    state = dict(np.load(newest))
    state["optimizer_0"] = np.zeros((3, 3), "float32")  # another model's moment
    np.savez(newest, **state)
    trainer = make(tmp_path, records, model_dir="run")
    assert trainer.restore_or_warm_start() and int(trainer.step.numpy()) == 4
    err = capsys.readouterr().err
    assert "ckpt-00000006 is damaged" in err and "training state of another model or run (optimizer_0" in err


def test_an_evaluation_interrupted_after_its_save_is_performed_on_resume(tmp_path):
    """Killed during the evaluation that follows a save: the resumed run owes that
    evaluation and performs it, so best.json is the uninterrupted run's."""
    records = build(str(tmp_path))
    settings = dict(save_steps=2, eval_steps=2, train_steps=2)
    whole = make(tmp_path, records, model_dir="whole", **settings)
    whole.train()
    cut = make(tmp_path, records, model_dir="cut", **settings)

    def killed(step):
        raise KeyboardInterrupt  # (as a SIGKILL between the save and the evaluation's record)

    cut.evaluate_and_keep_best = killed
    with pytest.raises(KeyboardInterrupt):
        cut.train()
    assert run_folder.latest_checkpoint(cut.tc.model_dir)[0] == 2 and run_folder.read_best(cut.tc.model_dir) is None
    make(tmp_path, records, model_dir="cut", **settings).train()  # nothing left to train, but an evaluation owed
    expected = run_folder.read_best(whole.tc.model_dir)
    assert run_folder.read_best(cut.tc.model_dir) == expected and expected["step"] == 2
    before = snapshot(cut.tc.model_dir)
    make(tmp_path, records, model_dir="cut", **settings).train()  # recorded: not evaluated again
    assert snapshot(cut.tc.model_dir) == before


def test_save_steps_zero_saves_at_the_end(tmp_path):
    records = build(str(tmp_path))
    trainer = make(tmp_path, records, save_steps=0, train_steps=4)
    trainer.train()
    assert [s for s, _ in run_folder.list_checkpoints(trainer.tc.model_dir)] == [4]


def test_rotation_deletes_only_what_a_checkpoint_holds(tmp_path):
    """A checkpoint folder with a file of the user's is left in place (its checkpoint
    files removed); leftovers of interrupted writes are removed, files of other names kept."""
    records = build(str(tmp_path))
    trainer = make(tmp_path, records, save_steps=1, train_steps=2, keep_checkpoint_max=1)
    trainer.train()
    model_dir = trainer.tc.model_dir
    with open(os.path.join(model_dir, "ckpt-00000002", "notes.txt"), "w") as f:
        f.write("mine")
    leftovers = ["ckpt-00000009.abcd1234.partial", "config.json.a1b2c3d4.partial"]
    for name in leftovers:
        os.makedirs(os.path.join(model_dir, name)) if name.startswith("ckpt") else open(
            os.path.join(model_dir, name), "w").close()
    for name in ("notes.partial", "data.json.abcd1234.partial"):  # not names of this program's writes
        open(os.path.join(model_dir, name), "w").close()
    trainer.tc.train_steps = 3
    trainer.train()
    names = set(os.listdir(model_dir))
    assert {"ckpt-00000002", "ckpt-00000003", "notes.partial", "data.json.abcd1234.partial"} <= names
    assert not names & set(leftovers)
    assert os.listdir(os.path.join(model_dir, "ckpt-00000002")) == ["notes.txt"]
    assert [s for s, _ in run_folder.list_checkpoints(model_dir)] == [3]


def test_rotation_and_locks_never_act_through_a_link(tmp_path):
    """A checkpoint folder that is a link into another run is rotated away as a link (the
    other run's files stay); a lock file that is a link is refused, its target untouched."""
    records = build(str(tmp_path))
    other = make(tmp_path / "other", records, save_steps=1, train_steps=1, keep_checkpoint_max=1)
    other.train()
    theirs = os.path.join(other.tc.model_dir, "ckpt-00000001")
    before = snapshot(other.tc.model_dir)
    trainer = make(tmp_path, records, save_steps=1, train_steps=1, keep_checkpoint_max=1)
    trainer.train()
    model_dir = trainer.tc.model_dir
    os.symlink(theirs, os.path.join(model_dir, "ckpt-00000000"))  # listed by the index below: rotated
    index = json.load(open(os.path.join(model_dir, run_folder.INDEX)))
    index["checkpoints"].insert(0, "ckpt-00000000")
    json.dump(index, open(os.path.join(model_dir, run_folder.INDEX), "w"))
    trainer.tc.train_steps = 2
    trainer.train()
    assert not os.path.lexists(os.path.join(model_dir, "ckpt-00000000"))
    assert snapshot(other.tc.model_dir) == before
    target = tmp_path / "precious.txt"
    target.write_text("keep me")
    folder = tmp_path / "locked"
    folder.mkdir()
    os.symlink(target, folder / files.LOCK)
    with pytest.raises(files.StorageError, match="is a symbolic link"):
        with files.exclusive(str(folder), "The run folder"):
            pass
    assert target.read_text() == "keep me"


def test_a_second_writer_of_a_folder_is_refused_and_a_dead_ones_lock_taken_over(tmp_path):
    import subprocess
    import sys

    folder = str(tmp_path / "run")
    with files.exclusive(folder, "The run folder"):
        with pytest.raises(files.InUseError, match=rf"is in use by pid {os.getpid()} on "):
            with files.exclusive(folder, "The run folder"):
                pass
        # (another process too)
        other = subprocess.run([sys.executable, "-c", "import sys; from txl_io import files\n"
                                f"with files.exclusive({folder!r}, 'x'): pass"], capture_output=True, text=True,
                               env={**os.environ, "PYTHONPATH": os.getcwd()})
        assert other.returncode != 0 and "InUseError" in other.stderr
    assert not os.path.exists(os.path.join(folder, files.LOCK))  # released: gone
    # a holder killed while it held the lock leaves the file, which the next writer takes over
    killed = subprocess.run([sys.executable, "-c", "import os; from txl_io import files\n"
                             f"with files.exclusive({folder!r}, 'x'): os.kill(os.getpid(), 9)"],
                            capture_output=True, env={**os.environ, "PYTHONPATH": os.getcwd()})
    assert killed.returncode == -9 and os.path.exists(os.path.join(folder, files.LOCK))
    with files.exclusive(folder, "The run folder"):
        assert json.load(open(os.path.join(folder, files.LOCK)))["pid"] == os.getpid()


@pytest.mark.parametrize("preset", ["tiny", "wt103_base", "lm1b_base", "enwik8_large"])
@pytest.mark.parametrize("changes", [{}, {"attn_type": 1}, {"tie_weight": False, "div_val": 1}])
def test_the_parameter_count_before_building_is_the_built_models(preset, changes):
    from txl_keras import TransformerXLLM

    small = dict(n_layer=2, d_model=16, d_embed=16, n_head=2, d_head=8, d_inner=32, tgt_len=4, mem_len=4)
    base = TransformerXLConfig.from_preset(preset)
    vocab = dict(n_token=300, cutoffs=[20, 60, 200]) if base.cutoffs else dict(n_token=50)
    if base.div_val > 1:
        small["d_embed"] = 64  # divisible by div_val ** 3
    config = TransformerXLConfig.from_preset(preset, **{**small, **vocab, **changes})
    assert sizes.parameter_count(config) == TransformerXLLM(config).count_params()


def test_a_full_disk_is_one_error_before_anything_is_written(trained, tmp_path, monkeypatch):
    """A checkpoint, the best weights or records that would not fit the free space: one
    StorageError naming the folder, and nothing of the write left behind."""
    from tf_records import build_records

    model_dir, records = copy_of(trained, tmp_path)
    trainer = make(tmp_path, records, model_dir="run")
    trainer.restore_or_warm_start()
    before = snapshot(str(tmp_path))
    monkeypatch.setattr(files, "free_bytes", lambda path: 1000)
    with pytest.raises(files.StorageError, match=rf"Not enough free space for checkpoint 6 at {model_dir}"):
        trainer.save()
    with pytest.raises(files.StorageError, match="Not enough free space for the best weights"):
        run_folder.save_best(model_dir, trainer.model, 6, {"loss": 1.0})
    with pytest.raises(files.StorageError, match="Not enough free space for the train records"):
        build_records("text", str(tmp_path / "records2"), text=str(trained[0] / "corpus.txt"), level="char",
                      splits=["train"], tgt_len=8, per_host_train_bsz=4, log=lambda *_: None)
    assert snapshot(str(tmp_path)) == before
    assert not os.path.exists(tmp_path / "records2")


@pytest.fixture
def read_only(tmp_path):
    """A read-only folder (a read-only tmpfs: the tests run as root, whom permissions do not stop)."""
    import subprocess

    folder = tmp_path / "read_only"
    folder.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(folder)],
                      capture_output=True).returncode != 0:
        pytest.skip("cannot mount a read-only filesystem here")
    yield str(folder)
    subprocess.run(["umount", str(folder)], capture_output=True)


def test_a_read_only_run_folder_is_one_line_naming_it(read_only, tmp_path):
    from helpers import train_command
    from programs import in_process

    records = build(str(tmp_path))
    result = in_process(train_command(records, read_only, "--train_steps=2", "--do_eval=false"))
    lines = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr[-2000:]
    assert len(lines) == 1 and f"Cannot access {read_only}/txl_keras.lock" in lines[0] and "Read-only" in lines[0]
