"""Stopping a training run on SIGINT or SIGTERM at the next step boundary, checkpoint first.

While `StopRequest.installed()` is active (in the main thread of a single-host run), the
first SIGINT or SIGTERM only records the request: the trainer, which runs its compiled
steps in calls of a few seconds each, sees it after the current call, saves a checkpoint,
says so and raises `Interrupted`. A second signal stops at once (KeyboardInterrupt), as
without the handler. Elsewhere (another thread, several hosts, whose collective steps
cannot stop one host alone) the signals keep their usual meaning.
"""

import contextlib
import signal
import threading

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Interrupted(KeyboardInterrupt):
    """Training stopped on a signal after saving a checkpoint; `exit_code` is 128 + the signal."""

    def __init__(self, message, signum):
        super().__init__(message)
        self.exit_code = 128 + int(signum)


class StopRequest:
    """The signal asking the run to stop (`signum`, None until one arrives)."""

    def __init__(self, log=print):
        self.signum = None
        self.log = log

    @property
    def name(self):
        return signal.Signals(self.signum).name if self.signum is not None else None

    def _handle(self, signum, frame):
        if self.signum is not None:
            raise KeyboardInterrupt  # the second one: at once
        self.signum = signum
        self.log(f"{signal.Signals(signum).name} received: stopping after the current step, with a checkpoint "
                 "(send it again to stop at once)")

    @contextlib.contextmanager
    def installed(self, enabled=True):
        if not enabled or threading.current_thread() is not threading.main_thread():
            yield self
            return
        previous = {s: signal.getsignal(s) for s in SIGNALS}
        for s in SIGNALS:
            signal.signal(s, self._handle)
        try:
            yield self
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)
