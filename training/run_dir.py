"""A run directory and its one writer: created and proven writable (`make_out_dir`), locked by the training
process (`lock_run_dir`), and every failed write there turned into one line (`could_not_write`).

Why an OS lock and not a "pid file": `fcntl.flock` belongs to the open file, so the kernel drops it when the
process ends in any way, SIGKILL and power loss included. A lock file left behind by a killed run is just a
file: the next run locks it again at once. The pid written into it only serves the message a second run
gets ("in use by pid N").

Whatever would change a run directory (checkpoint saves, recovering a checkpoint swap that a crash
interrupted, metrics, attention snapshots) happens in the process that holds this lock. Under torchrun only
rank 0 takes it (the only rank that writes); readers (sample.py, pretrained.checkpoint) never take it and never
write.

Failed writes: every file a run writes besides its checkpoints fails the same way a checkpoint save does: one line,
"could not write '<path>' (<reason>)", exit status 2, and the last good checkpoint intact.

Metrics, attention heatmaps and stats.csv are written between checkpoint saves, never over them, so a full
disk or a path that cannot be created (out_dir/attn being a file) stops the run before its next save, with
the checkpoint of the previous one untouched.
"""
from __future__ import annotations

import os
import socket
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from common.errors import UserError
from common.paths import RUN_LOCK

LOCK_FILE = RUN_LOCK  # what common/paths.py recognises a run by


@contextmanager
def could_not_write(path: str | Path, out_dir: str | Path) -> Iterator[None]:
    """Turn an OSError raised inside the block (writing `path`) into one line naming it (module doc)."""
    try:
        yield
    except OSError as e:
        reason = e.strerror or " ".join(str(e).split()) or type(e).__name__
        raise UserError(f"could not write '{path}' ({reason}); the last good checkpoint in '{out_dir}' is intact. "
                        f"Free disk space or fix permissions of '{out_dir}' (a file where a folder belongs?)") from None


def _unwritable(out_dir: Path, e: OSError) -> UserError:
    return UserError(f"cannot write to out_dir '{out_dir}' ({e.strerror or e}): choose a writable folder "
                     f"with out_dir=PATH")


def make_out_dir(out_dir: Path) -> None:
    """Create out_dir (and its parents) and prove it writable with a probe file, before anything is written
    there: one line naming it otherwise."""
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        probe = out_dir / ".write_test"
        probe.write_text("ok")
        probe.unlink()
    except OSError as e:
        raise _unwritable(out_dir, e) from None


class RunDirLock:
    """An exclusive lock on one run directory, held until `release()` (or the process ends)."""

    def __init__(self, out_dir: Path, fd: int):
        self.out_dir = out_dir
        self._fd: int | None = fd

    @property
    def held(self) -> bool:
        return self._fd is not None

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the last descriptor of the open file drops the flock
            self._fd = None

    def __enter__(self) -> "RunDirLock":
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def lock_run_dir(out_dir: str | Path) -> RunDirLock:
    """Take the run directory's lock, or raise UserError naming the process that holds it. The folder
    must exist. On systems without flock (Windows) the lock is a no-op that always succeeds."""
    out_dir = Path(out_dir)
    path = out_dir / LOCK_FILE
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as e:
        raise _unwritable(out_dir, e) from None
    try:
        import fcntl
    except ImportError:  # not POSIX
        return RunDirLock(out_dir, fd)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        try:
            text = os.pread(fd, 200, 0).decode("utf-8", "replace").strip()
        except OSError:
            text = ""
        holder = text.splitlines()[0] if text else "pid unknown"
        os.close(fd)
        raise UserError(f"out_dir '{out_dir}' is in use by another training run ({holder}): wait for it to "
                        f"finish or stop it, or choose another out_dir") from None
    except OSError as e:  # e.g. a filesystem without locks
        os.close(fd)
        raise UserError(f"cannot lock out_dir '{out_dir}' ({e.strerror or e}): put out_dir on a local "
                        f"filesystem") from None
    # ours now: say who holds it (only for the message a second run prints)
    info = f"pid {os.getpid()} on {socket.gethostname()}, started {time.strftime('%Y-%m-%d %H:%M:%S')}\n"
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, info.encode("utf-8"), 0)
    except OSError:
        pass  # a full disk: the lock holds all the same, only the message would lack the pid
    return RunDirLock(out_dir, fd)

