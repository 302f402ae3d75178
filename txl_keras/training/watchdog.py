"""Stop the process with a clear message when a blocking start-up call never returns.

Some TensorFlow start-up calls (a MultiWorkerMirroredStrategy whose peers never come, a
TPU address with nothing behind it) block inside C++ holding the GIL, so neither Python
threads nor signal handlers run. The watchdog is therefore a separate small process: it
waits on a pipe from this one and, if the pipe is still open when the time is up, prints
the message and kills this process. Leaving the block closes the pipe; so does this
process dying, so it never outlives its purpose.
"""

import os
import subprocess
import sys

_WATCHER = r"""
import os, select, sys
timeout, pid, message = float(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
ready, _, _ = select.select([sys.stdin], [], [], timeout)
if not ready:
    sys.stderr.write("error: %s (no answer within %g s)\n" % (message, timeout))
    sys.stderr.flush()
    os.kill(pid, 9)
"""


class Watchdog:
    """`with Watchdog(60, "what we waited for and what to do"):` kills this process
    (SIGKILL) after printing the message if the block lasts longer than the timeout."""

    def __init__(self, timeout_seconds, message):
        self.timeout = timeout_seconds
        self.message = message
        self._process = None

    def __enter__(self):
        if self.timeout and self.timeout > 0:
            self._process = subprocess.Popen(
                [sys.executable, "-c", _WATCHER, str(self.timeout), str(os.getpid()), self.message],
                stdin=subprocess.PIPE, stderr=sys.stderr, start_new_session=True)
        return self

    def __exit__(self, *exc):
        if self._process:
            self._process.stdin.close()
            self._process.wait()
        return False
