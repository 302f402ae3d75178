"""train_gpu.py on the JAX backend: one device against 8 virtual devices (data and model
parallel), two processes against one, a run folder resumed across backends, and a SIGKILL
at a random step resumed bit for bit."""

import os
import random
import shutil
import signal
import subprocess
import sys

import numpy as np
import pytest
from helpers import ROOT, build, env, run, summaries, train_command
from programs import in_process

from txl_keras import run_folder
from txl_keras.training.jax_route import parse_mesh

HERE = os.path.dirname(os.path.abspath(__file__))
DETERMINISTIC = ["--dropout=0", "--dropatt=0", "--iterations=1", "--do_eval=false"]


def jax_env(devices=1, **extra):
    return env(KERAS_BACKEND="jax", JAX_PLATFORMS="cpu",
               XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}", **extra)


def losses(model_dir):
    values = summaries(os.path.join(model_dir, "train"))["loss"]
    return [values[step] for step in sorted(values)]


def state_and_weights(model_dir):
    import h5py

    step, path = run_folder.latest_checkpoint(model_dir)
    weights = {}
    with h5py.File(os.path.join(path, "model.weights.h5")) as f:
        f.visititems(lambda name, obj: weights.__setitem__(name, obj[()]) if isinstance(obj, h5py.Dataset) else None)
    return step, weights, run_folder.load_state(path)


def test_the_mesh_flag_is_read_and_checked():
    assert parse_mesh(None, 8) == {"batch": 8, "model": 1}
    assert parse_mesh("batch:2,model:4", 8) == {"batch": 2, "model": 4}
    assert parse_mesh("model:2,batch:4", 8) == {"batch": 4, "model": 2}
    for text, message in (("batch:3", "has 3 devices but JAX sees 8"), ("data:8", "is not a mesh"),
                          ("batch:2,batch:4", "is not a mesh"), ("batch:0", "is not a mesh")):
        with pytest.raises(ValueError, match=message):
            parse_mesh(text, 8)


def test_jax_flags_on_tensorflow_are_refused_in_one_line(tmp_path):
    done = in_process([sys.executable, os.path.join(ROOT, "train_gpu.py"), "--mesh=batch:2",
                       f"--model_dir={tmp_path / 'm'}"])
    assert done.returncode != 0 and "--mesh is for the JAX backend" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.slow
def test_data_and_model_parallel_training_gives_one_devices_losses(tmp_path):
    # CI runs this test alone (.ci/run): XLA:CPU's collectives of 8 virtual devices on 2 cores
    # have hung beside another process's load; the flags end such a hang at 300 s.
    flags = ["--xla_force_host_platform_device_count=8", "--xla_cpu_collective_timeout_seconds=300",
             "--xla_cpu_collective_call_terminate_timeout_seconds=300"]
    done = run([sys.executable, os.path.join(HERE, "jax_mesh_run.py"), str(tmp_path)], timeout=600,
               env=env(KERAS_BACKEND="jax", JAX_PLATFORMS="cpu", XLA_FLAGS=" ".join(flags),
                       PYTHONPATH=HERE + os.pathsep + ROOT))
    assert done.returncode == 0, done.stderr[-3000:]
    import json

    runs = json.loads(done.stdout)
    single = runs["single"]["losses"]
    assert len(single) == 4
    for name in ("data_parallel", "model_parallel"):
        np.testing.assert_allclose(runs[name]["losses"], single, rtol=1e-5, atol=1e-5, err_msg=name)
        np.testing.assert_allclose(runs[name]["eval_loss"], runs["single"]["eval_loss"], rtol=1e-5, err_msg=name)
        for got, want in zip(runs[name]["weights"], runs["single"]["weights"]):
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5, err_msg=name)
    assert runs["qkv"] == {"spec": ["None", "model"], "shard_shapes": [[16, 12]], "devices": 8}  # 48 columns / 4
    assert runs["memory_spec"] == ["batch"]  # each replica holds its own streams' memory
    assert runs["dropout_rows_differ"]
    assert runs["lowered"] == {"f64": False, "callback": False, "dynamic": False}


@pytest.mark.slow
def test_a_run_folder_resumes_across_backends(tmp_path):
    """3 steps on one backend, the next 3 on the other: the losses of an uninterrupted run;
    and the validation loss of the weights of step 6 scored on JAX is TensorFlow's."""
    records = build(str(tmp_path))
    runs = {}
    evaluated = {"tensorflow": ["--do_eval=true"], "jax": []}  # (after DETERMINISTIC's --do_eval=false)
    for backend, environment in (("tensorflow", env(KERAS_BACKEND="tensorflow")), ("jax", jax_env())):
        model_dir = str(tmp_path / backend)
        done = run(train_command(records, model_dir, "--train_steps=6", "--save_steps=3", *DETERMINISTIC,
                                 *evaluated[backend]), env=environment)
        assert done.returncode == 0, done.stderr[-2000:]
        runs[backend] = model_dir
    for first, then, environment in (("tensorflow", "jax", jax_env()),
                                     ("jax", "tensorflow", env(KERAS_BACKEND="tensorflow"))):
        model_dir = str(tmp_path / f"{first}_then_{then}")
        shutil.copytree(runs[first], model_dir)
        shutil.rmtree(os.path.join(model_dir, "ckpt-00000006"))
        shutil.rmtree(os.path.join(model_dir, "train"))
        shutil.rmtree(os.path.join(model_dir, "eval"), ignore_errors=True)
        done = run(train_command(records, model_dir, "--train_steps=6", "--save_steps=3", *DETERMINISTIC,
                                 *evaluated[first]), env=environment)
        assert done.returncode == 0, done.stderr[-2000:]
        assert "resumed from" in done.stdout and "(step 3)" in done.stdout
        np.testing.assert_allclose(losses(model_dir), losses(runs[first])[3:], rtol=1e-5, atol=1e-5)
        _, got, state = state_and_weights(model_dir)
        _, want, reference = state_and_weights(runs[first])
        assert int(state["step"]) == 6 and sorted(state) == sorted(reference)
        for name in want:
            np.testing.assert_allclose(got[name], want[name], rtol=1e-4, atol=1e-5, err_msg=name)
        np.testing.assert_allclose(state["memory_0_replica_0"], reference["memory_0_replica_0"], rtol=1e-4,
                                   atol=1e-4)
    # The JAX trainer's evaluation (`scored_segment` through an `InferenceCache`) against the
    # TensorFlow trainer's (`Evaluation`), on the weights both runs end with.
    scored = {name: summaries(os.path.join(tmp_path, name, "eval"))["loss"]
              for name in ("tensorflow", "tensorflow_then_jax")}
    assert sorted(scored["tensorflow"]) == [0, 6] and sorted(scored["tensorflow_then_jax"]) == [6]
    assert scored["tensorflow_then_jax"][6] == pytest.approx(scored["tensorflow"][6], rel=1e-5)
    assert scored["tensorflow"][6] < scored["tensorflow"][0]  # (it trained)
    # A run folder written on JAX is a run folder: the text task loads it here (TensorFlow).
    from txl_keras import TransformerXLCausalLM

    lm = TransformerXLCausalLM.from_preset(runs["jax"])
    _, written, _ = state_and_weights(runs["jax"])
    assert sum(w.size for w in written.values()) == sum(w.size for w in lm.model.get_weights())
    score = lm.score("alpha beta gamma delta.")
    assert 1.0 < score.perplexity < 1e3


@pytest.mark.slow
def test_sigkill_at_a_random_step_resumes_bit_identically_on_jax(tmp_path):
    """Two replicas, dropout on: killed after a random step, the same command ends with the
    weights, optimizer, randomness and memories of an uninterrupted run, bit for bit."""
    records = build(str(tmp_path))
    flags = ["--train_steps=8", "--save_steps=2", "--iterations=1", "--do_eval=false", "--mesh=batch:2",
             "--dropout=0.1", "--dropatt=0.1"]
    killed = str(tmp_path / "killed")
    kill_after = random.Random().randint(3, 7)
    process = subprocess.Popen(["timeout", "-k", "10", "240"] + train_command(records, killed, *flags),
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=jax_env(2),
                               start_new_session=True)
    for line in process.stdout:
        if line.startswith(f"step {kill_after:>7d} |"):
            os.killpg(process.pid, signal.SIGKILL)
            break
    process.wait(timeout=60)
    assert process.returncode == -signal.SIGKILL, f"not killed at step {kill_after}"
    resumed = run(train_command(records, killed, *flags), env=jax_env(2))
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "resumed from" in resumed.stdout
    reference = str(tmp_path / "reference")
    uninterrupted = run(train_command(records, reference, *flags), env=jax_env(2))
    assert uninterrupted.returncode == 0, uninterrupted.stderr[-2000:]
    (step_a, weights_a, state_a), (step_b, weights_b, state_b) = state_and_weights(reference), state_and_weights(killed)
    assert step_a == step_b == 8 and sorted(state_a) == sorted(state_b)
    assert "memory_0_replica_1" in state_a and any(k.startswith("seed_") for k in state_a)
    for name in weights_a:
        np.testing.assert_array_equal(weights_a[name], weights_b[name], err_msg=name)
    for name in state_a:
        np.testing.assert_array_equal(state_a[name], state_b[name], err_msg=name)


def free_port():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_two_processes_train_as_one_and_a_missing_or_dying_peer_ends_the_other(tmp_path):
    """Two processes of 2 devices each, each reading its own host's records, give the training
    and validation losses of one process of 4 devices reading the same streams; a peer that never comes or that
    is killed mid-training ends the other with one error line, not a hang or a crash dump."""
    os.makedirs(tmp_path / "two")
    records = build(str(tmp_path / "two"), hosts=2)
    address = f"127.0.0.1:{free_port()}"
    model_dir = str(tmp_path / "processes")
    flags = ["--train_steps=4", "--save_steps=4", "--num_hosts=2", "--startup_timeout=120", *DETERMINISTIC,
             "--do_eval=true"]
    processes = [subprocess.Popen(
        ["timeout", "-k", "10", "240"] + train_command(records, model_dir, *flags, f"--coordinator_address={address}",
                                                       "--num_processes=2", f"--process_id={index}"),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=jax_env(2)) for index in range(2)]
    outputs = [p.communicate(timeout=260)[0] for p in processes]
    for p, out in zip(processes, outputs):
        assert p.returncode == 0, out[-3000:]
    os.makedirs(tmp_path / "one")
    one_records = build(str(tmp_path / "one"), batch=8)
    one = run(train_command(one_records, str(tmp_path / "one_process"), "--train_steps=4", "--save_steps=4",
                            "--train_batch_size=8", "--eval_batch_size=8", *DETERMINISTIC, "--do_eval=true"),
              env=jax_env(4))
    assert one.returncode == 0, one.stderr[-2000:]
    np.testing.assert_allclose(losses(model_dir), losses(str(tmp_path / "one_process")), rtol=1e-5, atol=1e-5)
    # and score the validation streams alike, before and after training (each process its share)
    scored = [summaries(os.path.join(folder, "eval"))["loss"] for folder in (model_dir, str(tmp_path / "one_process"))]
    assert sorted(scored[0]) == sorted(scored[1]) == [0, 4]
    np.testing.assert_allclose([scored[0][s] for s in (0, 4)], [scored[1][s] for s in (0, 4)], rtol=1e-5)
    assert not os.path.exists(os.path.join(model_dir, "worker-1"))  # process 0 writes for both
    # A second process that never comes: the first ends with one line, well within the timeout.
    lone = run(train_command(records, str(tmp_path / "lone"), "--num_hosts=2", "--startup_timeout=5",
                             f"--coordinator_address=127.0.0.1:{free_port()}", "--num_processes=2", "--process_id=0"),
               timeout=120, env=jax_env(2))
    assert lone.returncode != 0 and "not all 2 processes joined" in lone.stderr
    # A peer killed mid-training: the survivor stops at its next collective with one line.
    address = f"127.0.0.1:{free_port()}"
    pair = [subprocess.Popen(
        ["timeout", "-k", "10", "240"] + train_command(records, str(tmp_path / "dying"), "--train_steps=100000",
                                                       "--save_steps=100000", "--num_hosts=2", "--startup_timeout=120",
                                                       *DETERMINISTIC, f"--coordinator_address={address}",
                                                       "--num_processes=2", f"--process_id={index}"),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=jax_env(2), start_new_session=True)
        for index in range(2)]
    for line in pair[0].stdout:
        if line.startswith("step") and " | lr " in line:  # a step done: the processes are training
            break
    os.killpg(pair[1].pid, signal.SIGKILL)  # the process group: the trainer, not only `timeout`
    pair[1].wait()
    survivor_out, survivor_err = pair[0].communicate(timeout=120)
    assert pair[0].returncode == 1, survivor_err[-3000:]
    assert survivor_err.strip().splitlines()[-1].startswith("error: a collective across the 2 processes failed")
    assert "Traceback" not in survivor_err and "Fatal Python error" not in survivor_err
