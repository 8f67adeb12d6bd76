"""Every file a run writes besides its checkpoints fails the same way a checkpoint save does: one line,
"could not write '<path>' (<reason>)", exit status 2, and the last good checkpoint intact.

Metrics, attention heatmaps and stats.csv are written between checkpoint saves, never over them, so a full
disk or a path that cannot be created (out_dir/attn being a file) stops the run before its next save, with
the checkpoint of the previous one untouched.
"""
from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from common.errors import UserError


def write_error(path: str | Path, out_dir: str | Path, e: OSError) -> UserError:
    reason = e.strerror or " ".join(str(e).split()) or type(e).__name__
    return UserError(f"could not write '{path}' ({reason}); the last good checkpoint in '{out_dir}' is intact. "
                     f"Free disk space or fix permissions of '{out_dir}' (a file where a folder belongs?)")


@contextmanager
def could_not_write(path: str | Path, out_dir: str | Path) -> Iterator[None]:
    """Turn an OSError raised inside the block (writing `path`) into the one-line UserError above."""
    try:
        yield
    except OSError as e:
        raise write_error(path, out_dir, e) from None


def make_out_dir(out_dir: Path) -> None:
    """Create out_dir (and its parents) and prove it writable with a probe file, before anything is written
    there: one line naming it otherwise."""
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        probe = out_dir / ".write_test"
        probe.write_text("ok")
        probe.unlink()
    except OSError as e:
        raise UserError(f"cannot write to out_dir '{out_dir}' ({e.strerror or e}): choose a writable folder "
                        f"with out_dir=PATH") from None
