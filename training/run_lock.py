"""One writer per run directory: the training process holds an OS lock on `out_dir/.train.lock`.

Why an OS lock and not a "pid file": `fcntl.flock` belongs to the open file, so the kernel drops it when the
process ends in any way, SIGKILL and power loss included. A lock file left behind by a killed run is just a
file: the next run locks it again at once. The pid written into it only serves the message a second run
gets ("in use by pid N").

Whatever would change a run directory (checkpoint saves, recovering a checkpoint swap that a crash
interrupted, metrics, attention snapshots) happens in the process that holds this lock. Under torchrun only
rank 0 takes it (the only rank that writes); readers (sample.py, pretrained.checkpoint) never take it and never
write.
"""
from __future__ import annotations

import os
import socket
import time
from pathlib import Path

from common.errors import UserError
from common.paths import RUN_LOCK

LOCK_FILE = RUN_LOCK  # what common/paths.py recognises a run by


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
        raise UserError(f"cannot write to out_dir '{out_dir}' ({e.strerror or e}): choose a writable folder "
                        f"with out_dir=PATH") from None
    try:
        import fcntl
    except ImportError:  # not POSIX
        return RunDirLock(out_dir, fd)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = _read_holder(fd)
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


def _read_holder(fd: int) -> str:
    try:
        text = os.pread(fd, 200, 0).decode("utf-8", "replace").strip()
    except OSError:
        text = ""
    return text.splitlines()[0] if text else "pid unknown"

