"""The one printer: everything a command writes to stdout or stderr goes through here.

Each command line calls `install(prog)` before anything else; from then on sys.stdout and sys.stderr are
`GuardedStream`s around the real streams, so print(), tqdm's bars, W&B's lines and the one-line errors all
pass through the same rules:

- text the stream's encoding cannot hold (a lone surrogate, a character a latin-1 terminal lacks) is written
  as a backslash escape, never an exception;
- a closed pipe (`sample.py ... | head -c 10`) ends the command quietly with exit status 141, what a shell
  reports for a writer that SIGPIPE ended;
- any other failed write (a full device, `>/dev/full`) is one line on stderr naming the stream and the
  reason, then exit status 2;
- a command that must not stop for its console (a training run: out_dir keeps what it prints) passes
  `goes_on`: the stream's output is dropped from then on, a failure other than a closed pipe is one warning
  line, and the command ends as it would have.

A failed stream's descriptor is pointed at /dev/null, so that what the interpreter still holds for it (its
last flush, at exit) is dropped there instead of failing again with a traceback.
"""
from __future__ import annotations

import atexit
import errno
import os
import sys
import threading
from typing import Any, NoReturn

from common.errors import EXIT_USAGE, write_failure

EXIT_CLOSED_PIPE = 141  # 128 + SIGPIPE
CLOSED = (errno.EPIPE, errno.ECONNRESET)  # the reader went away: nothing to say, nobody to say it to


class GuardedStream:
    """A text stream (sys.stdout, sys.stderr) whose writes and flushes cannot raise: see the module doc.
    Everything else (fileno, isatty, encoding, ...) is the real stream's."""

    def __init__(self, inner: Any, name: str, printer: Printer):
        self._inner = inner  # None where the process started without this stream (`>&-`): print() drops it
        self.name = name  # "stdout" | "stderr"
        self._printer = printer
        self.failed = False

    def __getattr__(self, attr: str) -> Any:
        return getattr(self._inner, attr)

    def write(self, text: str) -> int:
        if self._inner is not None and not self.failed:
            try:
                try:
                    self._inner.write(text)
                except UnicodeEncodeError:  # a stream opened with errors="strict": escape what it cannot hold
                    encoding = getattr(self._inner, "encoding", None) or "utf-8"
                    self._inner.write(text.encode(encoding, "backslashreplace").decode(encoding))
            except OSError as e:
                self._printer.failed(self, e)
        return len(text)

    def flush(self) -> None:
        if self._inner is not None and not self.failed:
            try:
                self._inner.flush()
            except OSError as e:
                self._printer.failed(self, e)

    def drop(self) -> None:
        """From now on nothing reaches this stream; what the real stream still buffers goes to /dev/null."""
        self.failed = True
        try:
            null = os.open(os.devnull, os.O_WRONLY)
            os.dup2(null, self._inner.fileno())
            os.close(null)
        except (OSError, AttributeError, ValueError):  # a stream without a descriptor (a test's capture)
            pass


class Printer:
    """What a failed write means for this command: `prog` names it in the one line, `goes_on` (or None)
    says why it continues (a training run)."""

    def __init__(self, prog: str, goes_on: str | None):
        self.prog = prog
        self.goes_on = goes_on
        self.exiting = False  # the interpreter's exit has begun: SystemExit can no longer set the status

    def failed(self, stream: GuardedStream, e: OSError) -> None:
        stream.drop()
        closed = isinstance(e, BrokenPipeError) or e.errno in CLOSED
        if self.goes_on is not None:
            if not closed:
                self._say(f"{self.prog}: warning: cannot write to {stream.name} ({write_failure(e)}); {self.goes_on}")
            return
        if not closed:
            self._say(f"{self.prog}: error: cannot write to {stream.name} ({write_failure(e)}): free space where it "
                      f"goes, or send it elsewhere")
        self._end(EXIT_CLOSED_PIPE if closed else EXIT_USAGE)

    def _say(self, line: str) -> None:
        stderr = sys.stderr
        if isinstance(stderr, GuardedStream) and not stderr.failed:
            stderr.write(line + "\n")
            stderr.flush()

    def _end(self, code: int) -> NoReturn:
        """Exit with `code`: through SystemExit (finally blocks run, locks are released) from the main thread
        while the command runs; at once where SystemExit would be lost (another thread, the exit itself)."""
        if self.exiting or threading.current_thread() is not threading.main_thread():
            sys.stderr.flush()
            os._exit(code)
        raise SystemExit(code)

    def at_exit(self) -> None:
        """The last flush, before the interpreter's own: a pipe closed after the last write shows here."""
        self.exiting = True
        sys.stdout.flush()
        sys.stderr.flush()


def install(prog: str, goes_on: str | None = None) -> None:
    """Route this process's stdout and stderr through the printer (module doc). Installing again (a command
    called twice in one process) only sets the new command's name and policy."""
    printer = Printer(prog, goes_on)
    for name in ("stdout", "stderr"):
        current = getattr(sys, name)
        inner = current._inner if isinstance(current, GuardedStream) else current
        setattr(sys, name, GuardedStream(inner, name, printer))
    atexit.register(printer.at_exit)
