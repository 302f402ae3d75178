"""The programs print their own lines: TensorFlow's start-up notices are left out unless
asked for (real warnings and errors still show), and `--help` lists the flags by group with
the defaults a bare command uses."""

import dataclasses
import json
import os
import re
import subprocess
import sys

import pytest
from programs import in_process

from txl_io import startup

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

CAPTURED = """WARNING: All log messages before absl::InitializeLog() is called are written to STDERR
I0000 00:00:1796239904.802781    5348 port.cc:153] oneDNN custom operations are on. You may see ...
I0000 00:00:1796239904.803118    5348 cudart_stub.cc:31] Could not find cuda drivers on your machine, GPU will not be used.
I0000 00:00:1796239904.902486    5348 cpu_feature_guard.cc:227] This TensorFlow binary is optimized to use ...
To enable the following instructions: AVX2 AVX512F FMA, in other operations, rebuild TensorFlow with the appropriate compiler flags.
E0000 00:00:1796239907.841660    5348 cuda_platform.cc:52] failed call to cuInit: INTERNAL: CUDA error: Failed call to cuInit: UNKNOWN ERROR (303)
W0000 00:00:1796239907.900000    5348 some_op.cc:12] a real warning
E0000 00:00:1796239907.900001    5348 other.cc:34] a real error
/usr/lib/python3/site-packages/x.py:1: UserWarning: a Python warning
"""


def test_start_up_notices_are_left_out_and_real_lines_kept():
    assert startup.kept_lines(CAPTURED, has_gpu=False) == [
        "W0000 00:00:1796239907.900000    5348 some_op.cc:12] a real warning",
        "E0000 00:00:1796239907.900001    5348 other.cc:34] a real error",
        "/usr/lib/python3/site-packages/x.py:1: UserWarning: a Python warning"]
    # with a GPU on the machine, a failed CUDA probe is a real error
    assert any("cuInit" in line for line in startup.kept_lines(CAPTURED, has_gpu=True))


def test_verbosity_is_read_from_the_flags_and_the_environment():
    assert startup.verbose(["--verbosity=1"], {}) and startup.verbose([], {startup.ENVIRONMENT: "1"})
    assert not startup.verbose(["--verbosity=0"], {}) and not startup.verbose([], {})


def _run(argv, **env):
    environ = {k: v for k, v in os.environ.items() if k not in ("TF_CPP_MIN_LOG_LEVEL", startup.ENVIRONMENT)}
    environ.update(PYTHONPATH=ROOT, **env)
    return subprocess.run([sys.executable] + argv, cwd=ROOT, env=environ, capture_output=True, text=True,
                          timeout=300)


@pytest.fixture(scope="module")
def raw_tensorflow():
    """What TensorFlow itself prints on start-up, in a process of its own."""
    raw = _run(["-c", "import tensorflow as tf; tf.config.list_physical_devices()"])
    assert raw.stderr.strip(), "TensorFlow printed nothing on start-up: these tests check nothing here"
    return raw.stderr.splitlines()


def test_verbosity_brings_tensorflows_lines_back(tmp_path, raw_tensorflow):
    """Without it a program's stderr is its one error line (each program, in a process of its
    own: tests/training/test_unhappy_paths.py); with it TensorFlow's notices come back."""
    missing = str(tmp_path / "missing")
    loud = _run(["-m", "txl_keras.generate", f"--model_dir={missing}", "--prompt=a"], TXL_KERAS_TF_LOGS="1")
    assert loud.returncode == 1 and len(loud.stderr.splitlines()) >= len(raw_tensorflow) + 1
    assert loud.stderr.splitlines()[-1].startswith("error: ")


IMPORT_PROBE = """
import json, os, sys
environment = dict(os.environ)
import txl_keras
loaded = sorted(m for m in ("keras", "tensorflow", "jax") if m in sys.modules)
same_environment = dict(os.environ) == environment
from txl_keras import TransformerXLConfig, TransformerXLLM
import numpy as np
model = TransformerXLLM(TransformerXLConfig.from_preset("tiny"))
nll = model(np.ones((1, 4), "int32"), targets=np.ones((1, 4), "int32"), training=True)["nll"]
print(json.dumps({"loaded": loaded, "environment": same_environment,
                  "tensorflow": "tensorflow" in sys.modules, "finite": bool(np.isfinite(np.asarray(nll)).all())}))
"""


@pytest.mark.parametrize("backend", ["tensorflow", "jax"])
def test_importing_the_library_changes_nothing_and_imports_tensorflow_only_to_use_it(backend):
    """`import txl_keras` loads neither Keras nor TensorFlow and leaves the environment alone
    (Keras's own import sets variables of its own); a model's training step on JAX never
    imports TensorFlow, and on JAX nothing is printed."""
    out = _run(["-c", IMPORT_PROBE], KERAS_BACKEND=backend)
    assert out.returncode == 0, out.stderr[-3000:]
    assert backend == "tensorflow" or out.stderr == "", out.stderr  # TensorFlow's own notices are its own
    data = json.loads(out.stdout.strip().splitlines()[-1])
    assert data["loaded"] == [] and data["environment"] and data["finite"], data
    assert data["tensorflow"] == (backend == "tensorflow"), data


def _help_defaults(text):
    """`{flag: shown default or None}` and `{group: [flags]}` of absl's help text."""
    defaults, groups, group, flag = {}, {}, None, None
    for line in text.splitlines():
        if re.fullmatch(r"[a-z ]+:", line):
            group = line[:-1]
            groups[group] = []
        elif m := re.match(r"  --(?:\[no\])?(\w+):", line):
            flag = m.group(1)
            defaults[flag] = None
            groups[group].append(flag)
        elif m := re.match(r"\s+\(default: '(.*)'\)", line):
            defaults[flag] = m.group(1)
    return defaults, groups


BARE = """
import dataclasses, json
from absl import flags
from txl_keras.training import cli
cli.define_flags()
flags.FLAGS(["train_gpu.py"])
print(json.dumps(dataclasses.asdict(cli.train_config(None))))
"""


@pytest.mark.parametrize("script", ["train_gpu.py", "train_tpu.py"])
def test_help_groups_the_flags_and_shows_what_a_bare_command_uses(script):
    from txl_io import program
    from txl_keras.training import TrainConfig

    result = in_process([sys.executable, os.path.join(ROOT, script), "--help"])
    assert result.returncode == 0 and result.stderr == "", result.stderr
    defaults, groups = _help_defaults(result.stdout)
    assert list(groups) == [g for g in program.GROUPS if g in groups] and len(groups) >= 7
    listed = [f for fs in groups.values() for f in fs]
    assert len(listed) == len(set(listed))
    fields = [f.name for f in dataclasses.fields(TrainConfig) if f.name != "records_dir"]
    assert set(fields) | {"config", "data_dir", "n_layer", "tgt_len", "num_core_per_host"} <= set(listed)
    assert ("tpu" in groups["distribution"]) == (script == "train_tpu.py")
    bare = json.loads(in_process([sys.executable, "-c", BARE]).stdout.strip().splitlines()[-1])
    assert bare["train_steps"] == 1200 and bare["model_dir"] == "runs/quickstart"  # the quickstart preset
    for name in fields:
        shown, used = defaults[name], bare[name]
        if used is None or shown is None:
            assert shown is None and used is None, name
        elif isinstance(used, bool):
            assert shown == str(used).lower(), name
        elif isinstance(used, (int, float)):
            assert float(shown) == used, name
        else:
            assert shown == used, name


@pytest.mark.parametrize("program", ["txl_keras.generate", "txl_keras.export", "txl_keras.convert", "tf_records",
                                     "txl_keras.training.average_checkpoints"])
def test_every_program_answers_help_with_its_usage_and_exit_0(program):
    result = in_process([sys.executable, "-m", program, "--help"])
    assert result.returncode == 0 and result.stderr == "", result.stderr
    assert f"python -m {program}" in result.stdout and "--" in result.stdout


HELP_PROBE = """
import runpy, sys
target = sys.argv[1]
sys.argv = [target, "--help"]
try:
    (runpy.run_path if target.endswith(".py") else runpy.run_module)(target, run_name="__main__")
except SystemExit as e:
    assert e.code in (0, None), e.code
print(sorted(m for m in ("keras", "tensorflow", "jax") if m in sys.modules))
"""


@pytest.mark.parametrize("program", ["train_gpu.py", "train_tpu.py", "txl_keras.generate", "txl_keras.export",
                                     "txl_keras.convert", "tf_records", "txl_keras.training.average_checkpoints"])
def test_help_imports_neither_keras_nor_tensorflow(program):
    """`--help` prints the flags at once: a fresh process that asks for it loads no framework."""
    out = _run(["-c", HELP_PROBE, os.path.join(ROOT, program) if program.endswith(".py") else program])
    assert out.returncode == 0 and "--" in out.stdout, out.stderr[-3000:]
    assert out.stdout.strip().splitlines()[-1] == "[]", out.stdout[-500:]


def test_sigint_stops_a_program_started_with_sigint_ignored():
    """A shell starts a background job with SIGINT ignored; `kill -INT` still stops the
    program, with the one line of an interrupt and exit 130 (the program signals itself
    once it runs, so nothing depends on timing)."""
    import signal

    script = ("import os, signal, time\n"
              "from txl_io import program\n"
              "def main(argv):\n"
              "    os.kill(os.getpid(), signal.SIGINT)\n"
              "    for _ in range(600): time.sleep(0.1)\n"
              "    print('ran to the end')\n"
              "program.run(main)\n")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                            cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    assert result.returncode == 130 and "ran to the end" not in result.stdout, result.stderr
    assert result.stderr.strip().splitlines() == [
        "error: interrupted (files are written atomically: what was saved stays complete; the same command resumes)"]
