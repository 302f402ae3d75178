"""`programs.in_process` against a Python process of its own: the same exit code, stdout
and stderr for a clean exit, an exit with a message, an exit code and an uncaught
exception; the flags a program defines are gone afterwards."""

import subprocess
import sys

import pytest
from absl import flags
from programs import in_process

SCRIPTS = {
    "clean": "print('made')",
    "message": "import sys; print('partial'); sys.exit('error: --size must be positive')",
    "code": "import sys; sys.stderr.write('error: no records\\n'); sys.exit(3)",
    "exception": "raise ValueError('bad shape')",
}


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_a_program_in_process_ends_as_in_its_own_process(name):
    command = [sys.executable, "-c", SCRIPTS[name]]
    alone = subprocess.run(command, capture_output=True, text=True, timeout=60)
    here = in_process(command)
    assert (here.returncode, here.stdout) == (alone.returncode, alone.stdout)
    assert here.stderr.strip().splitlines()[-1:] == alone.stderr.strip().splitlines()[-1:]


def test_the_flags_a_program_defines_are_removed():
    script = ("from absl import app, flags; flags.DEFINE_integer('helper_probe', 1, 'a flag'); "
              "app.run(lambda argv: print(flags.FLAGS.helper_probe))")
    result = in_process([sys.executable, "-c", script, "--helper_probe=7"])
    assert (result.returncode, result.stdout) == (0, "7\n")
    assert "helper_probe" not in flags.FLAGS
