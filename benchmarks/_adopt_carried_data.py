"""Let a machine without `datasets` reuse prepared data copied from another machine (used by gpu_check.sh).

Why: the prepared folder's fingerprint (data/prepare.py) includes each corpus file's absolute path and
mtime. A copy of data/cache/ on another machine (e.g. carried to a GPU box) sits at another path, often
with new mtimes, so `prepare_data` sees a stale fingerprint and prepares again, which needs `datasets`
(and, for tinyshakespeare, the text in data/cache/tinyshakespeare/ so as not to download it).

What it does, through the project's own functions, for the `data:` section of CONFIG [+ overrides]:
the folder it maps to must exist and be complete (load_prepared); if its fingerprint already matches,
nothing happens; if it differs only by the files' paths and mtimes (same file names, same byte sizes),
meta.json's fingerprint and file list are rewritten to this machine's (the original is kept as
meta.json.carried). Any other difference is left alone and reported (exit status 1).

For throwaway machines only. The lasting fix belongs in data/prepare.py (a fingerprint of content or of
paths relative to the data folder).

    python benchmarks/_adopt_carried_data.py CONFIG [key=value ...]
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE)]

from common.errors import ArgumentParser, user_errors_exit  # noqa: E402


def main() -> int:
    parser = ArgumentParser(prog="_adopt_carried_data", description=__doc__.splitlines()[0])
    parser.add_argument("config")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    with user_errors_exit("_adopt_carried_data"):
        from data.prepare import META_FILE, fingerprint, load_prepared, prepared_root
        from data.sources import resolve_corpus
        from training.config import load_run_config

        cfg = load_run_config(args.config, args.overrides).data
        corpus = resolve_corpus(cfg, quiet=True)  # tinyshakespeare: the text must be there (no download offline)
        folder, fp = fingerprint(cfg, corpus)
        out_dir = prepared_root() / folder
        if not out_dir.is_dir():
            print(f"no prepared data at {out_dir}: carry data/cache/ (prepared/ and the corpus text)")
            return 1
        meta = load_prepared(out_dir).meta  # complete: meta.json and bins of the recorded sizes
        if meta.get("fingerprint") == fp:
            print(f"{out_dir}: reusable as it is")
            return 0
        old, new = meta.get("files") or [], corpus.file_stats
        same = len(old) == len(new) and all(Path(o[0]).name == Path(n[0]).name and o[1] == n[1]
                                            for o, n in zip(old, new))
        if not same:
            print(f"{out_dir}: prepared from other files ({old} vs {new}); left alone")
            return 1
        meta_path = out_dir / META_FILE
        backup = out_dir / (META_FILE + ".carried")
        if not backup.exists():
            backup.write_bytes(meta_path.read_bytes())
        meta["fingerprint"], meta["files"] = fp, new
        tmp = meta_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(meta, indent=2), encoding="utf-8")
        os.replace(tmp, meta_path)
        print(f"{out_dir}: adopted (files {[o[0] for o in old]} -> {[n[0] for n in new]}, same sizes; "
              f"original meta.json kept as {backup.name})")
        return 0


if __name__ == "__main__":
    sys.exit(main())
