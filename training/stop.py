"""A clean stop on SIGINT/SIGTERM: the loop finishes its step, saves, and returns."""
from __future__ import annotations

import signal


class StopRequested:
    """SIGINT/SIGTERM set a flag; the loop finishes its step, saves, and returns. A second Ctrl-C aborts."""

    def __init__(self):
        self.signal_name: str | None = None
        self._previous = {}

    def __enter__(self):
        for sig in (signal.SIGINT, signal.SIGTERM):
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
