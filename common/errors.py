"""One error type for bad user input.

Raised deep (a bad config key, a missing file, a corrupt checkpoint), caught once in each command
line's `main`, printed as a single line, exit status 2. Anything else is a bug and keeps its traceback.
"""
from __future__ import annotations

import argparse
import os
import sys
from contextlib import contextmanager
from typing import Iterator, NoReturn

EXIT_USAGE = 2


class UserError(Exception):
    """Something the user can fix: the message says what is wrong and how to fix it."""


@contextmanager
def user_errors_exit(prog: str, also: tuple[type[BaseException], ...] = ()) -> Iterator[None]:
    """Turn a `UserError` (or one of `also`, e.g. pretrained.checkpoint.CheckpointError) into one line on
    stderr, 'prog: error: ...', and exit status 2. Ctrl-C outside a training loop exits 130 quietly."""
    try:
        yield
    except (UserError, *also) as e:
        message = " ".join(str(e).split("\n"))
        print(f"{prog}: error: {message}", file=sys.stderr)
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
