"""Exit with a clear message when a blocking start-up call never returns."""

import os
import sys
import threading


class Watchdog:
    """`with Watchdog(60, "what we were waiting for and what to do"):` exits the process
    with status 3 and the message if the block takes longer than the timeout (some
    TensorFlow start-up calls block forever and ignore signals)."""

    def __init__(self, timeout_seconds, message):
        self.timeout = timeout_seconds
        self.message = message
        self._timer = None

    def _fire(self):
        sys.stderr.write(f"error: {self.message} (no answer within {self.timeout:g} s)\n")
        sys.stderr.flush()
        os._exit(3)

    def __enter__(self):
        if self.timeout and self.timeout > 0:
            self._timer = threading.Timer(self.timeout, self._fire)
            self._timer.daemon = True
            self._timer.start()
        return self

    def __exit__(self, *exc):
        if self._timer:
            self._timer.cancel()
        return False
