"""train_gpu.py / train_tpu.py as a user runs them: in subprocesses bounded by `timeout -k` where a
process of its own is what is checked (several workers, a signal, a missing TPU), else through
the program's own entry point in this process (`programs.in_process`)."""

import json
import os
import signal
import socket
import subprocess
import sys

import h5py
import numpy as np
import pytest
from helpers import ROOT, build, env, run, summaries, train_command
from programs import in_process

from txl_keras import run_folder as checkpoints
from txl_keras.training.tpu_versions import tensorflow_drives_tpus


def final_weights(model_dir):
    step, path = checkpoints.latest_checkpoint(model_dir)
    out = {}
    with h5py.File(os.path.join(path, "model.weights.h5")) as f:
        f.visititems(lambda name, obj: out.__setitem__(name, obj[()]) if isinstance(obj, h5py.Dataset) else None)
    return step, out, checkpoints.load_state(path)


def test_unknown_flags_and_missing_tpu_are_reported_clearly(tmp_path):
    bad = in_process([sys.executable, os.path.join(ROOT, "train_gpu.py"), "--num_host=2"])
    assert bad.returncode != 0 and "Unknown command line flag 'num_host'" in bad.stderr
    tpu = run([sys.executable, os.path.join(ROOT, "train_tpu.py")], timeout=60)
    assert tpu.returncode != 0 and "No TPU given: pass --tpu=NAME" in tpu.stderr
    local = run([sys.executable, os.path.join(ROOT, "train_tpu.py"), "--tpu=local"], timeout=60)
    import tensorflow as tf

    if tensorflow_drives_tpus(tf.__version__):
        assert local.returncode != 0 and "has no TPU devices" in local.stderr
    else:  # a TensorFlow past TPU support: one line naming both ways out
        assert local.returncode != 0 and f"TensorFlow {tf.__version__} cannot drive TPUs" in local.stderr
        assert "JAX backend" in local.stderr and "tensorflow-tpu==2.19.1" in local.stderr
        assert "Traceback" not in local.stderr


def test_a_released_model_to_evaluate_brings_its_own_model_and_weights(tmp_path):
    """--pretrained evaluates the release's newest weights with its own config: a --config,
    an --eval_ckpt_path or --do_train beside it is refused in one line, before anything is
    downloaded."""
    for extra, message in (("--config=tiny", "drop --config=tiny"), ("--eval_ckpt_path=x", "drop --eval_ckpt_path=x"),
                           ("--do_train=true", "it does not train")):
        done = in_process([sys.executable, os.path.join(ROOT, "train_gpu.py"), "--pretrained=transfo_xl_wt103",
                           f"--model_dir={tmp_path / 'm'}", extra], cwd=str(tmp_path))
        assert done.returncode == 1 and done.stderr.count("\n") == 1 and message in done.stderr, done.stderr
    assert not os.listdir(tmp_path)


def test_the_tensorflow_versions_that_drive_tpus():
    assert tensorflow_drives_tpus("2.19.1") and tensorflow_drives_tpus("2.20.0")
    assert not tensorflow_drives_tpus("2.21.0") and not tensorflow_drives_tpus("2.22.0rc1")
    assert not tensorflow_drives_tpus("3.0.0")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_workers_end_identical_and_equal_one_process_with_the_same_global_batch(tmp_path):
    records = build(str(tmp_path), hosts=2)
    ports = [free_port(), free_port()]
    cluster = {"worker": [f"127.0.0.1:{p}" for p in ports]}
    model_dir = str(tmp_path / "mw")
    processes = []
    for index in range(2):
        tf_config = json.dumps({"cluster": cluster, "task": {"type": "worker", "index": index}})
        command = ["timeout", "-k", "10", "180"] + train_command(
            records, model_dir, "--num_hosts=2", "--train_steps=6", "--iterations=3", "--save_steps=6",
            "--do_eval=false", "--startup_timeout=60", "--collective_timeout=60")
        processes.append(subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                          env=env(TF_CONFIG=tf_config)))
    outputs = [p.communicate(timeout=200)[0] for p in processes]
    for p, out in zip(processes, outputs):
        assert p.returncode == 0, out[-3000:]
    step_a, weights_a, _ = final_weights(model_dir)
    step_b, weights_b, _ = final_weights(os.path.join(model_dir, "worker-1"))
    assert step_a == step_b == 6
    for name in weights_a:
        np.testing.assert_array_equal(weights_a[name], weights_b[name], err_msg=name)
    # ... and equal one process that takes the same global batch (8 streams) on one device:
    # a worker reading another host's share, or a misaligned memory, would not
    os.makedirs(tmp_path / "one")
    one_records = build(str(tmp_path / "one"), batch=8)
    one = run(train_command(one_records, str(tmp_path / "one_process"), "--train_steps=6", "--iterations=3",
                            "--save_steps=6", "--do_eval=false", "--train_batch_size=8", "--eval_batch_size=8"))
    assert one.returncode == 0, one.stderr[-2000:]
    step_c, weights_c, _ = final_weights(str(tmp_path / "one_process"))
    assert step_c == 6
    for name in weights_a:
        np.testing.assert_allclose(weights_a[name], weights_c[name], rtol=1e-4, atol=1e-6, err_msg=name)


def test_a_worker_whose_peer_never_comes_exits_with_an_error(tmp_path):
    records = build(str(tmp_path), hosts=2)
    cluster = {"worker": [f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"]}
    tf_config = json.dumps({"cluster": cluster, "task": {"type": "worker", "index": 0}})
    lone = run(train_command(records, str(tmp_path / "lone"), "--num_hosts=2", "--startup_timeout=3"),
               timeout=120, env=env(TF_CONFIG=tf_config))
    assert lone.returncode != 0 and "not all 2 workers of TF_CONFIG joined" in lone.stderr


@pytest.mark.slow
def test_quickstart_on_the_default_corpus_lowers_validation_loss(tmp_path):
    """The README's main command, shortened: stdlib sources, no download."""
    command = [sys.executable, os.path.join(ROOT, "train_gpu.py"), "--train_steps=150", "--iterations=50",
               "--max_eval_batch=20", "--save_steps=0", "--model_dir=runs/e2e"]
    result = run(command, timeout=600, cwd=str(tmp_path))
    assert result.returncode == 0, result.stderr[-3000:]
    results = json.load(open(tmp_path / "runs" / "e2e" / "eval_results.json"))
    before, after = results["before"], results["after"]
    assert after["loss"] < before["loss"] - 1.0, (before, after)
    assert "validation bpc" in result.stdout
    # the same command again finds the finished run: it trains nothing and evaluates the same weights
    again = run(command, timeout=600, cwd=str(tmp_path))
    assert again.returncode == 0, again.stderr[-3000:]
    assert "nothing to train: the run is at step 150" in again.stdout
    assert "step     150 |" not in again.stdout
    loss = float(again.stdout.split("eval valid: loss ")[-1].split()[0])
    assert loss == pytest.approx(after["loss"], abs=1e-4)


def test_a_worker_whose_peer_dies_mid_training_exits_with_an_error(tmp_path):
    records = build(str(tmp_path), hosts=2)
    cluster = {"worker": [f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"]}
    processes = []
    for index in range(2):
        tf_config = json.dumps({"cluster": cluster, "task": {"type": "worker", "index": index}})
        command = ["timeout", "-k", "10", "170"] + train_command(
            records, str(tmp_path / "mw"), "--num_hosts=2", "--train_steps=100000", "--iterations=2",
            "--save_steps=0", "--do_eval=false", "--startup_timeout=60", "--collective_timeout=10")
        processes.append(subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                          env=env(TF_CONFIG=tf_config), start_new_session=True))
    for line in processes[0].stdout:
        if line.startswith("step "):
            break
    os.killpg(processes[1].pid, signal.SIGKILL)  # the worker, not only its `timeout` wrapper
    processes[1].wait()
    rest = processes[0].communicate(timeout=190)[0]
    assert processes[0].returncode not in (0, 124, -9, 137), rest[-2000:]  # an error, not the timeout


def test_every_checkpoint_is_evaluated_and_the_best_reported(tmp_path):
    records = build(str(tmp_path))
    model_dir = str(tmp_path / "m")
    trained = in_process(train_command(records, model_dir, "--train_steps=4", "--iterations=2", "--save_steps=2",
                                       "--do_eval=false"))
    assert trained.returncode == 0, trained.stderr[-2000:]
    evaluated = in_process(train_command(records, model_dir, "--do_eval_only", "--max_eval_batch=-1"))
    assert evaluated.returncode == 0, evaluated.stderr[-2000:]
    losses = {int(line.split("step ")[1].split(",")[0]): float(line.split("loss ")[1].split(",")[0])
              for line in evaluated.stdout.splitlines() if line.startswith("best checkpoint")}
    lines = [line for line in evaluated.stdout.splitlines() if line.startswith("eval valid: loss")]
    assert len(lines) == 2  # checkpoints of steps 2 and 4
    scores = [float(line.split("loss ")[1].split(" ")[0]) for line in lines]
    (best_step, best_loss), = losses.items()
    assert best_loss == pytest.approx(min(scores), abs=1e-4) and best_step == [2, 4][scores.index(min(scores))]


def tree(folder):
    return {os.path.relpath(os.path.join(d, n), folder): open(os.path.join(d, n), "rb").read()
            for d, _, names in os.walk(folder) for n in names}


def test_evaluation_during_training_in_tensorboard_and_the_best_weights_kept(tmp_path):
    records = build(str(tmp_path))
    model_dir = str(tmp_path / "m")
    trained = in_process(train_command(records, model_dir, "--train_steps=12", "--iterations=2", "--save_steps=4",
                                       "--eval_steps=4", "--learning_rate=1e-2"))
    assert trained.returncode == 0, trained.stderr[-2000:]
    logged = [float(line.split("loss ")[1].split(" ")[0]) for line in trained.stdout.splitlines()
              if line.startswith("eval valid: loss")]
    assert len(logged) == 4  # before training, then at steps 4, 8, 12 (the last one reused at the end)
    train, evals = summaries(os.path.join(model_dir, "train")), summaries(os.path.join(model_dir, "eval"))
    for tag in ("loss", "lr", "gnorm", "bpc", "tokens_per_s", "model_flops_per_s"):
        assert sorted(train[tag]) == [2, 4, 6, 8, 10, 12], tag
    assert json.loads(train["config"][0].strip()) == json.load(open(os.path.join(model_dir, "config.json")))
    assert json.loads(train["train_config"][0].strip())["eval_steps"] == 4
    assert sorted(evals["loss"]) == [0, 4, 8, 12]
    for step, loss in zip((0, 4, 8, 12), logged):
        assert evals["loss"][step] == pytest.approx(loss, abs=1e-4)
        assert evals["bpc"][step] == pytest.approx(evals["loss"][step] / np.log(2), rel=1e-5)
        assert evals["ppl"][step] == pytest.approx(np.exp(evals["loss"][step]), rel=1e-4)
    assert len(set(evals["tokens"].values())) == 1 and evals["tokens"][0] > 0
    during = {4: logged[1], 8: logged[2], 12: logged[3]}
    best = json.load(open(os.path.join(model_dir, "best.json")))
    assert best["step"] == min(during, key=during.get)
    assert [n for n in os.listdir(model_dir) if n.startswith("best-")] == [best["weights"]]
    assert json.load(open(os.path.join(model_dir, "eval_results.json")))["best"]["step"] == best["step"]
    assert f"best validation loss {best['loss']:.4f}" in trained.stdout
    # the kept weights score the best loss; evaluation alone writes nothing into the run folder
    before = tree(model_dir)
    again = in_process(train_command(records, model_dir, "--do_train=false",
                                     f"--eval_ckpt_path={os.path.join(model_dir, best['weights'])}"))
    assert again.returncode == 0, again.stderr[-2000:]
    score = float(again.stdout.split("eval valid: loss ")[1].split(" ")[0])
    assert score == pytest.approx(during[best["step"]], abs=1e-4)
    assert tree(model_dir) == before


def interrupted_run(records, model_dir, signum):
    """train_gpu.py on a run of a million steps in one log interval, sent `signum` a second
    after it says training started (inside its first call of steps, which traces them):
    (the finished process, its standard error)."""
    # (a bound against a hang only: a loaded machine may take minutes to trace and stop)
    command = ["timeout", "-k", "10", "900"] + train_command(records, model_dir, "--train_steps=1000000",
                                                               "--iterations=1000000", "--save_steps=0",
                                                               "--do_eval=false", "--lr_schedule=constant")
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env())
    for line in process.stdout:  # the handler is installed; the first call of steps begins
        if line.startswith("training from step"):
            break
    import time

    time.sleep(1)  # inside the first call, which traces the steps (or a later one)
    process.send_signal(signum)
    stdout, stderr = process.communicate(timeout=960)
    return process, stderr


def test_a_stop_request_records_sigint_and_sigterm_and_a_second_one_stops_at_once():
    """In process: the first signal is recorded (the trainer stops at its next call of steps),
    a second raises at once; the handlers before are restored afterwards."""
    import os
    import threading

    from txl_keras.training.interrupts import Interrupted, StopRequest

    if threading.current_thread() is not threading.main_thread():
        pytest.skip("signal handlers are installed from the main thread only")
    before = signal.getsignal(signal.SIGTERM)
    said = []
    for signum in (signal.SIGTERM, signal.SIGINT):
        with StopRequest(said.append).installed() as stop:
            os.kill(os.getpid(), signum)
            assert stop.signum == signum and signal.Signals(signum).name in said[-1]
            with pytest.raises(KeyboardInterrupt):
                os.kill(os.getpid(), signum)
    assert signal.getsignal(signal.SIGTERM) is before
    assert Interrupted("stopped", signal.SIGTERM).exit_code == 143


@pytest.mark.parametrize("signum", [signal.SIGINT])
def test_a_signal_stops_training_within_a_compiled_loop_with_a_checkpoint_and_it_resumes(tmp_path, signum):
    """Long before its million-step loop would end, SIGINT (SIGTERM alike, tested in process
    above) stops the run at a step boundary, saves that step and says so; resuming from it
    gives the weights of a run that never stopped (a constant learning rate: the same at
    every step whatever the run's length)."""
    records = build(str(tmp_path))
    process, stderr = interrupted_run(records, str(tmp_path / "cut"), signum)
    assert process.returncode == 128 + signum, stderr[-2000:]
    errors = [line for line in stderr.splitlines() if line.startswith("error:")]
    name = signal.Signals(signum).name
    assert len(errors) == 1 and f"interrupted ({name}: stopped at step" in errors[0], stderr[-2000:]
    step, _, _ = final_weights(str(tmp_path / "cut"))
    assert errors[0].split("stopped at step ")[1].split(",")[0] == str(step) and 0 < step < 1000000
    target = step + 3
    same = ("--iterations=2", "--save_steps=0", "--do_eval=false", "--lr_schedule=constant")  # (lr of any length)
    resumed = in_process(train_command(records, str(tmp_path / "cut"), f"--train_steps={target}", *same))
    assert resumed.returncode == 0 and f"training from step {step} to {target}" in resumed.stdout, resumed.stderr
    whole = in_process(train_command(records, str(tmp_path / "whole"), f"--train_steps={target}", *same))
    assert whole.returncode == 0, whole.stderr[-2000:]
    _, weights_cut, _ = final_weights(str(tmp_path / "cut"))
    _, weights_whole, _ = final_weights(str(tmp_path / "whole"))
    for name in weights_whole:
        np.testing.assert_array_equal(weights_cut[name], weights_whole[name], err_msg=name)
