"""A program of the project run inside the test's process, as its command line runs it:
the same flags, the same `error:` line and exit code, without starting Python and
TensorFlow again for each case (the tests keep one real process per program)."""

import contextlib
import io
import os
import runpy
import subprocess
import sys
import traceback
import warnings

import keras
from absl import flags

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def in_process(command, cwd=None):
    """`command` (`[python, script.py, ...]`, `[python, -m, module, ...]` or `[python, -c,
    code, ...]`) run here:
    a `subprocess.CompletedProcess` with its exit code, stdout and stderr (an uncaught
    exception is exit 1 with its traceback on stderr, as Python prints it). The flags the
    program defines are removed afterwards and the global dtype policy restored, so the
    next program defines its own."""
    assert os.path.basename(command[0]).startswith("python"), f"not a Python command line: {command[:3]}"
    if command[1] == "-c":
        target, arguments, run = "-c", command[3:], lambda: exec(command[2], {"__name__": "__main__"})
    elif command[1] == "-m":
        target, arguments, run = command[2], command[3:], lambda: runpy.run_module(command[2], run_name="__main__",
                                                                                  alter_sys=True)
    else:
        target, arguments, run = command[1], command[2:], lambda: runpy.run_path(command[1], run_name="__main__")
    known = set(flags.FLAGS)
    saved = sys.argv, os.getcwd(), keras.config.dtype_policy()
    stdout, stderr, code = io.StringIO(), io.StringIO(), 0
    try:
        sys.argv = [target] + list(arguments)
        if cwd:
            os.chdir(cwd)
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr), warnings.catch_warnings():
            # (runpy's note that the package imported the module before: this process did)
            warnings.filterwarnings("ignore", "'.*' found in sys.modules", RuntimeWarning)
            try:
                run()
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
                if not isinstance(e.code, (int, type(None))):  # Python prints another exit value
                    print(e.code, file=sys.stderr)
            except Exception:  # what Python does with an uncaught exception
                traceback.print_exc(file=sys.stderr)
                code = 1
    finally:
        sys.argv = saved[0]
        os.chdir(saved[1])
        keras.config.set_dtype_policy(saved[2])
        for name in set(flags.FLAGS) - known:
            delattr(flags.FLAGS, name)
        flags.FLAGS.unparse_flags()
    return subprocess.CompletedProcess(command, code, stdout.getvalue(), stderr.getvalue())
