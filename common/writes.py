"""Every file the product writes, written one way.

Why one way: a run, a dump, a conversion and a data preparation each write into a folder they own, and each
of them used to open its targets its own way; one of those ways followed a symbolic link at the target (a
dump folder holding `a.png -> run/latest/model.safetensors` overwrote the run's weights), another trained
inside another run's `latest/`, which that run's next save deletes. Here the rules hold for every writer:

`write_file(path, content)`   the whole new file or the old one, never a mix, never through a link:
    1. the nearest run or model folder holding the target (common/paths.py: enclosing_run, from the target's
       folder up) must be one this process writes (`owning`) or lie inside one; with none, the target is in
       no one's run. A writer never writes inside someone else's run or model folder;
    2. the content goes to a new temporary name beside the target, created exclusively (O_EXCL: never an
       existing file, never a link), is fsynced, then renamed over the target: a rename replaces a link at
       the target instead of writing where it points;
    3. the folder is fsynced, so the rename survives a crash.
    `content` is bytes, str (written as UTF-8), or a function given the open binary temporary file (a
    library that writes to a path can use its `.name`); `writing(path)` is the same for a writer that streams.
`append_text(path, text)`   lines added to a log (metrics.jsonl, stats.csv): rule 1; a link at the target is
    refused (O_NOFOLLOW); a last line cut short by a crash is ended first, so the new lines start on a line
    of their own and the torn one is the only one lost.
`owning(root, what)`   a folder this process writes (a run's out_dir, a model folder being saved, convert.py's
    output): refused, naming `what`, when it lies inside a run or model folder this process does not write --
    that folder's owner replaces what it holds (a run's next save swaps its latest/ and best/ whole) -- and
    taken as this process's until the block ends.

Failures are OSError as raised; each writer turns them into its own one-line message (training/run_dir.py:
could_not_write).
"""
from __future__ import annotations

import errno
import os
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import BinaryIO, Callable, Iterator, Union

from common.errors import UserError
from common.paths import enclosing_run

Content = Union[bytes, str, Callable[[BinaryIO], None]]


_owned: list[Path] = []  # the folders this process writes, innermost last (`owning`)


def _check_folder(folder: Path, refused: Callable[[Path, str], str]) -> None:
    """Rule 1 (module doc) for something written into `folder`: the nearest run or model folder holding it,
    if any, is one this process writes. `refused(that folder, why it is one)` says what is refused."""
    found = enclosing_run(folder)
    if found is not None and not any(found[0] == root or root in found[0].parents for root in _owned):
        raise UserError(refused(*found))


@contextmanager
def owning(root: str | Path, what: str = "the folder") -> Iterator[Path]:
    """The block writes `root` (module doc); yields it resolved."""
    resolved = Path(root).expanduser().resolve()
    _check_folder(resolved.parent, lambda folder, reason: (
        f"{what} '{resolved}' lies inside the run or model folder '{folder}' ({reason}), whose saves replace what "
        f"it holds: choose a folder outside it"))
    _owned.append(resolved)
    try:
        yield resolved
    finally:
        _owned.remove(resolved)


def _target(path: str | Path) -> Path:
    """`path` made absolute after rule 1 (module doc): its folder resolved, not its name (a link there is replaced)."""
    path = Path(path).expanduser()
    target = path.parent.resolve() / path.name
    _check_folder(target.parent, lambda folder, reason: (
        f"will not write '{target}': it lies inside the run or model folder '{folder}' ({reason}), which "
        f"another process writes; choose a folder outside it"))
    return target


def fsync_dir(folder: str | Path) -> None:
    """Make a rename or a new file in `folder` durable (POSIX; a no-op where a folder cannot be opened)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        with suppress(OSError):
            os.fsync(fd)
    finally:
        os.close(fd)


def write_file(path: str | Path, content: Content) -> Path:
    """Write `content` to `path` whole (module doc); returns the target's absolute path."""
    with writing(path) as f:
        if callable(content):
            content(f)
        else:
            f.write(content.encode("utf-8") if isinstance(content, str) else content)
    return Path(f.target)


@contextmanager
def writing(path: str | Path) -> Iterator[BinaryIO]:
    """write_file for a writer that streams: the block writes the open temporary file (its `.target` is the
    final path), which replaces `path` when the block ends, and is removed when it raises."""
    target = _target(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    try:
        f = open(tmp, "xb")  # O_CREAT | O_EXCL: fails on any existing name, a link included
    except FileExistsError:  # left by a killed process that had this pid: ours to remove (a link: the link)
        os.unlink(tmp)
        f = open(tmp, "xb")
    f.target = target
    try:
        with f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(target.parent)


def append_text(path: str | Path, text: str) -> None:
    """Append the lines of `text` (a final newline added) to the log at `path`, a torn last line ended first."""
    target = _target(path)
    try:
        fd = os.open(target, os.O_RDWR | os.O_APPEND | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o644)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise UserError(f"'{target}' is a symbolic link, and a log is never written through one: remove "
                            f"the link") from None
        raise
    try:
        size = os.fstat(fd).st_size
        torn = size > 0 and os.pread(fd, 1, size - 1) != b"\n"
        # not fsynced: a log line lost to a power cut costs nothing a torn line's repair does not already cover
        os.write(fd, (("\n" if torn else "") + text.rstrip("\n") + "\n").encode("utf-8"))
    finally:
        os.close(fd)
