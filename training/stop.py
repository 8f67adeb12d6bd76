"""A clean stop on SIGINT/SIGTERM: the loop finishes its step, saves, and returns."""
from __future__ import annotations

import signal


class StopRequested:
    """SIGINT/SIGTERM set a flag; the loop finishes its step, saves, and returns. A second Ctrl-C aborts.

    A signal the process was started ignoring stays ignored: `nohup train.py ... &` and `cmd &` in a script
    start it with SIGINT ignored, the shell's way of saying that a Ctrl-C meant for the terminal is not for
    this run (Python's own KeyboardInterrupt is not installed then either)."""

    def __init__(self):
        self.signal_name: str | None = None
        self._previous = {}

    def __enter__(self):
        for sig in (signal.SIGINT, signal.SIGTERM):
            if signal.getsignal(sig) is signal.SIG_IGN:
                continue
            try:
                self._previous[sig] = signal.signal(sig, self._handle)
            except ValueError:  # not the main thread: leave signals alone
                pass
        return self

    def _handle(self, signum, frame):
        if self.signal_name is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.signal_name = signal.Signals(signum).name

    def __exit__(self, *exc):
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        return False
