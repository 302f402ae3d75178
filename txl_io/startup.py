"""A quiet start: TensorFlow's start-up lines kept off the terminal.

Importing TensorFlow and probing its devices writes lines straight to the process's
stderr from C++, before any log level applies: the oneDNN and CPU-instruction notices,
"Could not find cuda drivers", and on a machine without a GPU an `E0000 ... failed call
to cuInit` that reads like a failure. `quiet_tensorflow()` imports TensorFlow and lists
its devices with stderr captured, then writes back every captured line that is not one
of those notices (a real warning or error still shows), and sets `TF_CPP_MIN_LOG_LEVEL=1`
(C++ info lines off, warnings and errors on) unless the environment sets it.

Every program (the trainers, `python -m tf_records`, `python -m txl_keras.*`, the bench
scripts) calls `start_program()` first: TensorFlow's BFC CPU allocator
(`cpu_allocator`), then this quiet import (skipped for `--help`, which imports no TensorFlow). Importing a package of the project does
neither. `--verbosity=1` (or higher) on the command line or `TXL_KERAS_TF_LOGS=1` shows
everything TensorFlow prints.
"""

import os
import re
import sys
import tempfile

from txl_io.cpu_allocator import prefer_bfc_cpu_allocator

ENVIRONMENT = "TXL_KERAS_TF_LOGS"
_NOISE = [
    r"WARNING: All log messages before absl::InitializeLog\(\) is called are written to STDERR",
    r"I\d{4} .*",  # C++ information lines (oneDNN, CPU instructions, CUDA drivers not found, devices)
    r"To enable the following instructions: .*rebuild TensorFlow with the appropriate compiler flags\.",
    r"E\d{4} .*Unable to register cu(DNN|FFT|BLAS) factory: .*",  # duplicate plugin registration
]
_NO_GPU_PROBE = r"E\d{4} .*failed call to cuInit: .*"


def verbose(argv=None, environ=None):
    """`--verbosity=N` (N >= 1) on the command line or TXL_KERAS_TF_LOGS=1: show TensorFlow's lines."""
    environ = os.environ if environ is None else environ
    if environ.get(ENVIRONMENT, "0") not in ("", "0"):
        return True
    for arg in sys.argv[1:] if argv is None else argv:
        match = re.fullmatch(r"--(?:verbosity|v)=(-?\d+)", arg)
        if match and int(match.group(1)) >= 1:
            return True
    return False


def kept_lines(text, has_gpu):
    """The captured start-up text less TensorFlow's notices (and the CUDA probe without a GPU)."""
    noise = _NOISE + ([] if has_gpu else [_NO_GPU_PROBE])
    return [line for line in text.splitlines() if not any(re.fullmatch(p, line) for p in noise)]


def _has_gpu_device_files():
    return any(os.path.exists(p) for p in ("/dev/nvidiactl", "/dev/nvidia0", "/dev/dxg"))


def quiet_tensorflow():
    """Import TensorFlow and probe its devices with the start-up notices left out."""
    if "tensorflow" in sys.modules or verbose():
        return
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as capture:
        os.dup2(capture.fileno(), 2)
        try:
            import tensorflow as tf

            tf.config.list_physical_devices()
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            capture.seek(0)
            text = capture.read().decode("utf-8", errors="replace")
            for line in kept_lines(text, _has_gpu_device_files()):
                print(line, file=sys.stderr)


HELP_FLAGS = ("-h", "-?", "--help", "--helpshort", "--helpfull", "--helpxml")


def asks_for_help(argv=None):
    """Whether the command line asks for the flags' help (which needs no TensorFlow)."""
    return any(arg in HELP_FLAGS for arg in (sys.argv[1:] if argv is None else argv))


def start_program():
    """A program's start, before it imports TensorFlow: the BFC CPU allocator (unless the
    environment chose), then TensorFlow imported quietly (not for --help, which prints the
    flags without importing it)."""
    prefer_bfc_cpu_allocator()
    if not asks_for_help():
        quiet_tensorflow()
