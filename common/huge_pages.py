"""A command line's process run again, once, with its C library's memory in 2 MB pages.

Decoding one token streams every weight of the model from memory once (GPT-2 small: 250 MB in bfloat16). Where
the kernel's transparent huge pages are `madvise` (a common default), memory is mapped in 4 KB pages unless the
program asks for more: a weight streamed through 4 KB pages takes a TLB miss, and a page-table walk, every 4 KB,
and the matmuls run below the memory's bandwidth. glibc (2.35 and later) asks for 2 MB pages on all of malloc's
memory when its `glibc.malloc.hugetlb=1` tunable is set, which covers torch's tensors and the matmul libraries'
packed copies of the weights alike; but a tunable is read once, when the process starts. So a command line that
decodes calls `restart_in_huge_pages()` first thing: where the tunable would change something, the process
replaces itself (exec: same process id, same open files, nothing run yet) with the same command under the
tunable. benchmarks/RESULTS.md has the measured gain (sample.py on GPT-2 small's shape, bfloat16 and int8).

Nothing is done, and the command runs as it is, where:
- the platform is not Linux, or the C library is not glibc 2.35 or later (older glibc ignores the tunable);
- transparent huge pages are `never` (none to have) or `always` (large mappings get them without asking);
- GLIBC_TUNABLES already names glibc.malloc.hugetlb (the user's choice; also what ends the restart after one);
- ATTNGPT_HUGE_PAGES=0 (to measure or run without);
- the process was not started as this script's own command (a script run in-process by another program, e.g.
  a test or runpy: its command line is someone else's, which must not run twice).
"""
from __future__ import annotations

import os
import platform
import sys
from collections.abc import Mapping
from pathlib import Path

from common.errors import EXIT_USAGE, UserError

TUNABLE = "glibc.malloc.hugetlb"
SWITCH = "ATTNGPT_HUGE_PAGES"  # 0 turns the restart off; 1 (or unset) leaves it on
THP_ENABLED = Path("/sys/kernel/mm/transparent_hugepage/enabled")
FIRST_GLIBC = (2, 35)  # the first glibc with the hugetlb tunable


def thp_mode(enabled: Path = THP_ENABLED) -> str | None:
    """The kernel's transparent huge page mode, the bracketed word of `always [madvise] never`; None where the file
    is absent or unreadable (no THP, or not Linux)."""
    try:
        words = enabled.read_text().split()
    except OSError:
        return None
    chosen = [w[1:-1] for w in words if w.startswith("[") and w.endswith("]")]
    return chosen[0] if len(chosen) == 1 else None


def glibc_version() -> tuple[int, ...] | None:
    """(major, minor) of the glibc this interpreter runs on; None for another C library."""
    name, version = platform.libc_ver()
    if name != "glibc":
        return None
    try:
        return tuple(int(part) for part in version.split(".")[:2])
    except ValueError:
        return None


def tunable_value(tunables: str) -> str | None:
    """The value GLIBC_TUNABLES (`name=value:name=value...`) gives glibc.malloc.hugetlb; None where it names none."""
    values = [value for name, _, value in (entry.partition("=") for entry in tunables.split(":")) if name == TUNABLE]
    return values[-1] if values else None


def malloc_in_huge_pages(environ: Mapping[str, str], mode: str | None) -> bool:
    """Whether a process with this environment has malloc's large blocks in 2 MB pages: THP `always` gives them
    unasked, `madvise` where the tunable asks (=1)."""
    return mode == "always" or (mode == "madvise" and tunable_value(environ.get("GLIBC_TUNABLES", "")) == "1")


def huge_page_environment(environ: Mapping[str, str], mode: str | None,
                          glibc: tuple[int, ...] | None) -> dict[str, str] | None:
    """The environment to run the command again in (`environ` with the tunable added to GLIBC_TUNABLES, the
    entries already there kept in front), or None where running again would change nothing (module doc). Raises
    UserError for an ATTNGPT_HUGE_PAGES other than 0 or 1."""
    switch = environ.get(SWITCH, "1")
    if switch not in ("0", "1"):
        raise UserError(f"{SWITCH} must be 0 (no 2 MB pages) or 1 (the default), got {switch!r}")
    tunables = environ.get("GLIBC_TUNABLES", "")
    if switch == "0" or tunable_value(tunables) is not None or mode != "madvise" \
            or glibc is None or glibc < FIRST_GLIBC:
        return None
    return {**environ, "GLIBC_TUNABLES": f"{tunables}:{TUNABLE}=1" if tunables else f"{TUNABLE}=1"}


def started_as_this_command() -> bool:
    """True where the interpreter's own command line ends with sys.argv: `python [options] script.py args...`,
    the script being the program. False under `python -c`, `python -m` and any script run in-process by another
    (its sys.argv set by hand), whose command must not be run again."""
    original = getattr(sys, "orig_argv", None)
    return bool(original and sys.argv and sys.argv[0] and len(original) > len(sys.argv)
                and original[-len(sys.argv):] == sys.argv)


def restart_in_huge_pages(prog: str) -> None:
    """Replace this process with the same command under glibc.malloc.hugetlb=1 where that changes something (module
    doc); return where it does not. Call before anything has run: an exec starts the command from its beginning.
    A bad ATTNGPT_HUGE_PAGES is one line, `prog: error: ...`, and exit status 2."""
    if not sys.platform.startswith("linux") or not sys.executable or not started_as_this_command():
        return
    try:
        environ = huge_page_environment(os.environ, thp_mode(), glibc_version())
    except UserError as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        sys.exit(EXIT_USAGE)
    if environ is None:
        return
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], environ)
