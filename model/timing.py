"""Timing candidate kernels on this machine, for the choices made by measurement (model/packed.py's layout,
model/quantize.py's LM head, model/generate.py's compile rule): a handful of calls, in interleaved rounds so
that a slow spell of a shared machine falls on every candidate, the best round counting."""
from __future__ import annotations

import time
from typing import Callable


def best_seconds(runs: dict[str, Callable[[], object]], rounds: int = 5, calls: int = 5,
                 clock: Callable[[], float] = time.perf_counter) -> dict[str, float]:
    """Each run's seconds per call: one warm-up call of each, then `rounds` rounds, each timing `calls` calls of
    every run in turn; the best round of each run counts."""
    for run in runs.values():
        run()
    best = dict.fromkeys(runs, float("inf"))
    for _ in range(rounds):
        for name, run in runs.items():
            t0 = clock()
            for _ in range(calls):
                run()
            best[name] = min(best[name], (clock() - t0) / calls)
    return best
