"""One error type for bad user input.

Raised deep (a bad config key, a missing file, a corrupt checkpoint), caught once in each command
line's `main`, printed as a single line, exit status 2. Anything else is a bug and keeps its traceback.
"""
from __future__ import annotations

import argparse
import errno
import os
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, NoReturn

EXIT_USAGE = 2
# a write that failed for want of room: the cause in words (the disk is what needs fixing, not the file), the fix
NO_ROOM = {errno.ENOSPC: ("the disk is full", "free space on that disk, or write somewhere with room"),
           errno.EDQUOT: ("the disk quota is used up", "free space within the quota, or write somewhere with room"),
           errno.EFBIG: ("the file reached the file-size limit", "raise the limit (ulimit -f), or write less")}


class UserError(Exception):
    """Something the user can fix: the message says what is wrong and how to fix it."""


def write_failure(e: OSError) -> str:
    """Why a write failed, naming the cause first where it is the disk: 'the disk is full: No space left on device'."""
    reason = e.strerror or str(e)
    return f"{NO_ROOM[e.errno][0]}: {reason}" if e.errno in NO_ROOM else reason


def out_of_room(e: BaseException, writing: str | Path | None = None) -> UserError | None:
    """The UserError for a write that failed for want of room (NO_ROOM), found anywhere in e's chain (a
    library's error wrapping the OSError), naming the file the error names or else `writing`, the folder being
    written; None for any other failure."""
    seen: list[BaseException] = []
    while e is not None and e not in seen:
        if isinstance(e, OSError) and e.errno in NO_ROOM:
            target = e.filename or writing or "a file"
            return UserError(f"cannot write '{target}' ({write_failure(e)}): {NO_ROOM[e.errno][1]}")
        seen.append(e)
        e = e.__cause__ or e.__context__  # type: ignore[assignment]
    return None


def out_of_memory(e: BaseException, device: object, fix: str) -> UserError | None:
    """The UserError for running out of memory (Python's MemoryError, numpy's, torch's on a CPU or a GPU) on
    `device`, with the reason and `fix`, the setting to lower; None for any other failure."""
    text = " ".join(str(e).split())
    if not (isinstance(e, MemoryError) or type(e).__name__ == "OutOfMemoryError" or "can't allocate memory" in text
            or "out of memory" in text.lower()):
        return None
    return UserError(f"out of memory on {device} ({text[:200]}): {fix}")


@contextmanager
def user_errors_exit(prog: str, also: tuple[type[BaseException], ...] = ()) -> Iterator[None]:
    """Turn a `UserError` (or one of `also`, e.g. pretrained.checkpoint.CheckpointError) into one line on
    stderr, 'prog: error: ...', and exit status 2; so is a write that fails for want of room (out_of_room), from
    wherever it comes. Ctrl-C outside a training loop exits 130 quietly."""
    try:
        yield
    except (UserError, *also, OSError) as e:
        error = out_of_room(e) if isinstance(e, OSError) and not isinstance(e, also) else e
        if error is None:
            raise
        print(f"{prog}: error: " + str(error).replace("\n", " "), file=sys.stderr)  # one line, always
        sys.exit(EXIT_USAGE)
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        sys.exit(130)


def exit_now(code: int) -> NoReturn:
    """End the process with `code` at once, after flushing stdout and stderr, skipping the interpreter's
    finalization and exit hooks. For a process that has left its gloo process group: finalization can destroy
    gloo's threads unjoined while objects (DDP's reducer) still hold the group, and under load a finished
    process once aborted there ("terminate called without an active exception", SIGABRT). And for Ctrl-C
    before training: wandb's exit hook would wait for a server that does not answer."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


class ArgumentParser(argparse.ArgumentParser):
    """argparse with one-line errors: 'prog: error: ...', exit status 2, no usage block (`--help` shows it)."""

    def error(self, message: str) -> NoReturn:
        print(f"{self.prog}: error: {message} (see {self.prog} --help)", file=sys.stderr)
        sys.exit(EXIT_USAGE)
