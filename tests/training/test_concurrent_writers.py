"""Concurrency with real processes: one writer per run folder (a second trainer is refused,
a killed one's lock taken over), two exports to one folder (one completes, the other is
refused), an interrupted export (killed inside its publication) completed by the same
command, and readers while a trainer rotates its checkpoints."""

import os
import signal
import subprocess
import sys
import time

import pytest
from helpers import build, env, run, train_command

from txl_io import files
from txl_keras import run_folder

PY = sys.executable
pytestmark = pytest.mark.slow


def error_lines(text):
    return [line for line in text.splitlines() if line.startswith("error:")]


def wait_for(predicate, seconds=120):
    end = time.time() + seconds
    while time.time() < end:
        if predicate():
            return True
        time.sleep(0.2)
    return False


def start(command, **kwargs):
    """A program in the background, in a process group of its own (`kill` ends all of it)."""
    return subprocess.Popen(["timeout", "-k", "10", "300"] + command, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=kwargs.pop("env", env()),
                            start_new_session=True, **kwargs)


def kill(process):
    """SIGKILL to the program and the `timeout` around it."""
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGKILL)
    return process.communicate(timeout=60)


def test_one_trainer_per_run_folder_and_a_killed_ones_lock_taken_over(tmp_path):
    records = build(str(tmp_path))
    model_dir = str(tmp_path / "run")
    flags = ["--train_steps=100000", "--iterations=20", "--save_steps=20", "--do_eval=false"]
    first = start(train_command(records, model_dir, *flags))
    try:
        assert wait_for(lambda: run_folder.latest_checkpoint(model_dir)[0]), first.stderr
        second = run(train_command(records, model_dir, *flags), timeout=120)
        lines = error_lines(second.stderr)
        assert second.returncode == 1 and len(lines) == 1 and "Traceback" not in second.stderr, second.stderr[-2000:]
        assert f"The run folder {model_dir} is in use by pid" in lines[0]
    finally:
        kill(first)  # SIGKILL: its lock file stays behind
    assert os.path.exists(os.path.join(model_dir, files.LOCK))
    step = run_folder.latest_checkpoint(model_dir)[0]
    resumed = run(train_command(records, model_dir, f"--train_steps={step + 4}", "--iterations=2", "--save_steps=2",
                                "--do_eval=false"))
    assert resumed.returncode == 0 and f"(step {step})" in resumed.stdout, resumed.stderr[-2000:]
    assert not os.path.exists(os.path.join(model_dir, files.LOCK))


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    root = tmp_path_factory.mktemp("trained")
    records = build(str(root))
    done = run(train_command(records, str(root / "run"), "--train_steps=2", "--iterations=2", "--do_eval=false"))
    assert done.returncode == 0, done.stderr[-2000:]
    return root


def export_command(root, output):
    return [PY, "-m", "txl_keras.export", f"--model_dir={root}/run", f"--output={output}"]


def loads(path):
    probe = subprocess.run([PY, "-c", "import sys, tensorflow as tf; tf.saved_model.load(sys.argv[1])", path],
                           capture_output=True, text=True, env=env(), timeout=300)
    return probe.returncode == 0


def test_two_exports_to_one_folder_one_completes_the_other_is_refused(trained, tmp_path):
    output = str(tmp_path / "exported")
    both = [start(export_command(trained, output)) for _ in range(2)]
    results = [(p.wait(300), *p.communicate()) for p in both]
    codes = sorted(code for code, _, _ in results)
    assert codes == [0, 1], results
    refused = next(err for code, _, err in results if code == 1)
    lines = error_lines(refused)
    assert len(lines) == 1 and ("is in use by pid" in lines[0] or "is not empty" in lines[0]), refused[-2000:]
    assert loads(output)
    assert sorted(os.listdir(tmp_path)) == ["exported"]  # no staging folder left


def test_an_export_killed_while_it_publishes_is_completed_by_the_same_command(trained, tmp_path):
    output = str(tmp_path / "exported")
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(  # kills the process as it renames its staging folder into place
        "import os, signal\n"
        "original = os.replace\n"
        "def replace(source, target, *args, **kwargs):\n"
        "    if str(source).endswith('.exported.partial'):\n"
        "        os.kill(os.getpid(), signal.SIGKILL)\n"
        "    return original(source, target, *args, **kwargs)\n"
        "os.replace = replace\n")
    killing = env()
    killing["PYTHONPATH"] = str(hook) + os.pathsep + killing["PYTHONPATH"]
    killed = run(export_command(trained, output), env=killing)
    assert killed.returncode == -9
    assert not os.path.exists(output)  # nothing partial under the output's name
    staging = tmp_path / ".exported.partial"
    assert (tmp_path / ".exported.lock").exists() and (staging / "saved_model.pb").exists()
    again = run(export_command(trained, output))
    assert again.returncode == 0, again.stderr[-2000:]
    assert loads(output) and sorted(os.listdir(tmp_path)) == ["exported", "hook"]


def test_readers_take_the_newest_checkpoint_while_a_trainer_rotates_them(tmp_path):
    """A trainer saving every step and keeping one checkpoint; meanwhile this process loads
    the newest model six times and averages twice with the program: every read succeeds."""
    records = build(str(tmp_path))
    model_dir = str(tmp_path / "run")
    first = run(train_command(records, model_dir, "--train_steps=1", "--iterations=1", "--do_eval=false"))
    assert first.returncode == 0, first.stderr[-2000:]
    trainer = start(train_command(records, model_dir, "--train_steps=100000", "--iterations=1", "--save_steps=1",
                                  "--keep_checkpoint_max=1", "--do_eval=false"))
    try:
        assert wait_for(lambda: (run_folder.latest_checkpoint(model_dir)[0] or 0) > 2), trainer.stderr
        steps = set()
        for k in range(6):
            run_folder.load_trained_model(model_dir)
            steps.add(run_folder.latest_checkpoint(model_dir)[0])
            if k < 2:
                output = str(tmp_path / f"averaged-{k}.weights.h5")
                result = run([PY, "-m", "txl_keras.training.average_checkpoints", f"--model_dir={model_dir}",
                              "--num_last=1", f"--output={output}"])
                assert result.returncode == 0, result.stderr[-2000:]
        assert trainer.poll() is None and len(steps) > 1  # the trainer rotated them all along
    finally:
        kill(trainer)
