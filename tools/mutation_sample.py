"""A fixed sample of mutmut's mutants, and the score over it (a developer tool, never run by CI).

mutmut (`pip install mutmut`, configured in setup.cfg) plants one small bug at a time in model/,
training/, data/loader.py, data/sharded.py, data/prepare.py, data/prepared.py, common/, insight/,
pretrained/ and sample.py and runs the tests that reach it. All ~10,000 mutants would take days on two cores, so we test a sample: the mutants whose name
hashes (CRC-32) to 0 modulo `--every`. The hash makes the sample independent of the order in which mutmut
lists mutants, and unbiased across files and kinds of mutation. `--only` narrows it to some modules or
functions (name prefixes; `recent` stands for RECENT, `newest` for NEWEST). docs/testing.md holds the
commands and the results.

    python tools/mutation_sample.py names [--every 10] [--only recent]   # the sampled mutant names
    python tools/mutation_sample.py score [--every 10] [--only recent]   # killed / tested over the sample, per file
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
# the code added after the first mutation runs (docs/testing.md): name prefixes of its mutants. sample.py's
# share is its output (run() and the streaming printer), not its argument parsing.
RECENT = ("insight.", "pretrained.", "pretrained.hf.", "data.sharded.", "training.autotune.", "training.resume.",
          "training.evaluate.", "training.state_check.", "sample.x_run__", "sample.xǁStreamPrinterǁ")
# the code added after the run over RECENT (docs/testing.md, 2026-12-01): the one writer, the one printer, the
# path-kind rule, the no-room and out-of-memory messages, the paths' UTF-8 rule, untrusted JSON, the schema,
# the model's finite check and its replay, MFU's bound, auto's agreeing rounds, the run plan, resuming, the
# readers' lock on prepared data and train_loop (nonfinite=skip's last save).
NEWEST = ("common.writes.", "common.console.", "common.path_kind.", "common.errors.x_out_of_room__",
          "common.errors.x_out_of_memory__", "common.paths.x_expand_path__", "common.json_file.x_parse_json__",
          "common.json_file.x__finite_float__", "common.json_file.x__refuse_constant__", "common.schema.",
          "model.gpt.xǁGPTǁ_check_finite__", "training.runtime.xǁPeakFlopsǁ", "training.autotune.x_compare__",
          "training.autotune.x__fastest__", "training.autotune.xǁComparisonǁ", "training.plan.",
          "training.resume.", "data.prepared.", "data.prepare.x__no_readers__", "training.trainer.x_train_loop__")
GROUPS = {"recent": RECENT, "newest": NEWEST}


def all_mutants() -> dict[str, int | None]:
    """mutant name -> mutmut's exit code (None before it ran), over every mutated file."""
    out: dict[str, int | None] = {}
    for meta in sorted(MUTANTS.rglob("*.meta")):
        out.update(json.loads(meta.read_text())["exit_code_by_key"])
    return out


def sampled(every: int, only: tuple[str, ...] = ()) -> dict[str, int | None]:
    """The mutants whose name's CRC-32 is 0 modulo `every`, of those starting with one of `only` (all if empty)."""
    return {name: code for name, code in all_mutants().items()
            if zlib.crc32(name.encode("utf-8")) % every == 0 and (not only or name.startswith(only))}


def status(code: int | None) -> str:
    return STATUS.get(code, "suspicious")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=["names", "score"])
    parser.add_argument("--every", type=int, default=10, help="keep mutants whose CRC-32 is 0 modulo this")
    parser.add_argument("--only", nargs="+", default=[], metavar="PREFIX",
                        help="keep mutants whose name starts with one of these (`recent`: the RECENT modules, "
                             "`newest`: the NEWEST ones)")
    args = parser.parse_args()
    only = tuple(p for prefix in args.only for p in GROUPS.get(prefix, (prefix,)))
    sample = sampled(args.every, only)
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
    pool = sum(1 for name in all_mutants() if not only or name.startswith(only))
    print(f"sample: {len(sample)} of {pool} mutants (every {args.every}); {dict(total)}")
    print(f"score: {killed}/{checked} killed = {100 * killed / max(checked, 1):.1f}%")


if __name__ == "__main__":
    main()
