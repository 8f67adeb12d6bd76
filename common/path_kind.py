"""What is at a path the user named, by one rule, so that each message says what is really there.

    path_kind(path) -> PathKind     kind: file | directory | stream | missing | denied | unusable

A FIFO (a shell's `<(cat ...)`), a character device (/dev/zero, /dev/stdin), a block device and a socket are
a "stream": readable once, from the start, with no size to check first. Each reader of a user's path says
what each kind means for it (a config is read from a stream up to its limit; a corpus, read more than once,
must be a regular file) and words its message with `says`, which follows the path: "'/dev/zero' is a
character device". Symbolic links are followed: the kind is that of what they point to.
"""
from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path

STREAMS = {stat.S_IFIFO: "a FIFO (a pipe, such as a shell's <(...))", stat.S_IFCHR: "a character device",
           stat.S_IFBLK: "a block device", stat.S_IFSOCK: "a socket"}


@dataclass(frozen=True)
class PathKind:
    kind: str  # file | directory | stream | missing | denied | unusable
    says: str  # what is there, as the rest of a sentence about the path: "is a character device"


def path_kind(path: str | Path) -> PathKind:
    try:
        mode = os.stat(path).st_mode
    except (FileNotFoundError, NotADirectoryError):  # NotADirectoryError: a part of the path is a file
        return PathKind("missing", "does not exist")
    except PermissionError as e:
        return PathKind("denied", f"cannot be reached ({e.strerror}: a folder on the way is not readable to you)")
    except OSError as e:  # a loop of links, a name too long
        return PathKind("unusable", f"cannot be looked up ({e.strerror or e})")
    except ValueError:  # a NUL character, which no path can hold
        return PathKind("unusable", "cannot be a path (it holds a NUL character)")
    if stat.S_ISREG(mode):
        return PathKind("file", "is a regular file")
    if stat.S_ISDIR(mode):
        return PathKind("directory", "is a directory")
    return PathKind("stream", f"is {STREAMS.get(stat.S_IFMT(mode), 'not a regular file')}")
