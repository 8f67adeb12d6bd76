"""One error type for bad user input.

Raised deep (a bad config key, a missing file, a corrupt checkpoint), caught once in each command
line's `main`, printed as a single line, exit status 2. Anything else is a bug and keeps its traceback.
"""
from __future__ import annotations

import sys
from contextlib import contextmanager
from typing import Iterator

EXIT_USAGE = 2


class UserError(Exception):
    """Something the user can fix: the message says what is wrong and how to fix it."""


@contextmanager
def user_errors_exit(prog: str) -> Iterator[None]:
    """Turn a `UserError` (and Ctrl-C outside training) into one line on stderr and exit status 2."""
    try:
        yield
    except UserError as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        sys.exit(EXIT_USAGE)
