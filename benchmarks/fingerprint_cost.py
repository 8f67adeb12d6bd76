"""What the prepare fingerprint costs: hashing every byte of a local corpus file (data/sources.py: `_stats`).

Why: every `train.py` and `python -m data.prepare` start fingerprints the local corpus to know whether its
prepared shards are still its own (data/prepare.py), and since the fingerprint covers the whole content, that
cost grows with the corpus. This writes a file of random bytes (--mb, default 100 MB) into a temporary folder,
then times `_stats` on it: the first read, and --rounds more (the median), both from the page cache, which
is where a corpus that was just written or read lies (a cold read from disk is bounded by the disk instead).
For comparison, the same with hashlib's sha1 and blake2b over the same 1 MiB chunks.

    python benchmarks/fingerprint_cost.py [--mb 100] [--rounds 5] [--no-save]
"""
from __future__ import annotations

import argparse
import hashlib
import os
import sys
import tempfile
from pathlib import Path

import _report
from data.sources import _stats

CHUNK = 1 << 20


def hash_file(path: Path, name: str) -> str:
    digest = hashlib.new(name)
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=100, help="size of the file hashed, in MB (10**6 bytes)")
    parser.add_argument("--rounds", type=int, default=5)
    _report.save_flags(parser)
    args = parser.parse_args(argv)
    load = _report.load_average()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "corpus.txt"
        with open(path, "wb") as f:
            for _ in range(args.mb):
                f.write(os.urandom(1_000_000))
        candidates = {"data.sources._stats (sha256, what the fingerprint uses)": lambda: _stats([path]),
                      **{f"hashlib {n}, same chunks": lambda n=n: hash_file(path, n) for n in ("sha1", "blake2b")}}
        # (name, seconds of the first call, median of --rounds more)
        rows = [(name, _report.median_seconds(fn), _report.median_seconds(fn, args.rounds))
                for name, fn in candidates.items()]
    per_100 = 100 / args.mb
    lines = [f"## Prepare fingerprint: hashing a local corpus file whole ({_report.timestamp()})", "",
             f"- Machine: {_report.machine(extra=[load, _report.cpu_bf16_support()])}",
             f"- CPU hash flags: {_report.flag_list(('sha_ni', 'avx2'))}",
             f"- Command: `{_report.command('fingerprint_cost.py', argv)}`",
             f"- A {args.mb} MB file of random bytes in a temporary folder, read from the page cache in 1 MiB chunks; "
             f"median of {args.rounds} rounds after a first one.", "",
             "| what | first call s | median s | s per 100 MB | MB/s |", "|---|---:|---:|---:|---:|"]
    for name, first, median in rows:
        lines.append(f"| {name} | {first:.3f} | {median:.3f} | {median * per_100:.3f} | {args.mb / median:,.0f} |")
    print("\n".join(lines))
    if not args.no_save:
        print(f"appended to {_report.append_section(lines)}", file=sys.stderr)


if __name__ == "__main__":
    main()
