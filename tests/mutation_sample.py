"""A fixed sample of mutmut's mutants, and the score over it (a developer tool, never run by CI).

mutmut (`pip install mutmut`, configured in setup.cfg) plants one small bug at a time in model/,
training/, data/loader.py and sample.py and runs the tests that reach it. All ~6,000 mutants would take
days on two cores, so we test a sample: the mutants whose name hashes (CRC-32) to 0 modulo `--every`.
The hash makes the sample independent of the order in which mutmut lists mutants, and unbiased across
files and kinds of mutation. docs/testing.md holds the commands and the results.

    python tests/mutation_sample.py names [--every 10]     # the sampled mutant names (after mutmut generated them)
    python tests/mutation_sample.py score [--every 10]     # killed / tested over the sample, per file
"""
from __future__ import annotations

import argparse
import json
import re
import zlib
from collections import Counter, defaultdict
from pathlib import Path

MUTANTS = Path("mutants")
# mutmut's exit codes in its .meta files, as mutmut 3 reads them (mutmut/stats.py); anything else is "suspicious"
STATUS = {1: "killed", 3: "killed", 0: "survived", 5: "no tests", 2: "interrupted", None: "not checked",
          33: "no tests", 34: "skipped", 35: "suspicious", 36: "timeout", 37: "caught by type check",
          -24: "timeout", 24: "timeout", 152: "timeout", 255: "timeout", -11: "segfault", -9: "segfault"}
KILLED = ("killed", "timeout", "segfault", "caught by type check")  # what mutmut counts as caught


def all_mutants() -> dict[str, int | None]:
    """mutant name -> mutmut's exit code (None before it ran), over every mutated file."""
    out: dict[str, int | None] = {}
    for meta in sorted(MUTANTS.rglob("*.meta")):
        out.update(json.loads(meta.read_text())["exit_code_by_key"])
    return out


def sampled(every: int) -> dict[str, int | None]:
    return {name: code for name, code in all_mutants().items()
            if zlib.crc32(name.encode("utf-8")) % every == 0}


def status(code: int | None) -> str:
    return STATUS.get(code, "suspicious")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=["names", "score"])
    parser.add_argument("--every", type=int, default=10, help="keep mutants whose CRC-32 is 0 modulo this")
    args = parser.parse_args()
    sample = sampled(args.every)
    if args.command == "names":
        print("\n".join(sorted(sample)))
        return
    per_file: dict[str, Counter] = defaultdict(Counter)
    for name, code in sample.items():
        module = re.match(r"(.*?)\.x[ǁ_]", name).group(1)  # 'training.optim.x_lr_factor__mutmut_3' -> training.optim
        per_file[module][status(code)] += 1
    total = Counter()
    for module in sorted(per_file):
        total.update(per_file[module])
        print(f"{module:28s} {dict(per_file[module])}")
    killed = sum(total[s] for s in KILLED)
    checked = sum(n for s, n in total.items() if s not in ("not checked", "interrupted"))
    print(f"sample: {len(sample)} of {len(all_mutants())} mutants (every {args.every}); {dict(total)}")
    print(f"score: {killed}/{checked} killed = {100 * killed / max(checked, 1):.1f}%")


if __name__ == "__main__":
    main()
