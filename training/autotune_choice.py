"""What `dtype: auto` / `train.compile: auto` decided (training/autotune.py), and its file in out_dir.

A Choice holds the dtype and compile setting, each comparison in the order it was made (the candidates'
ms per step, or per call of the fused attention kernel, the baseline and the one kept), and prints them
in one line; `save_choice` writes it atomically, `saved_choice` reads it back for a resume, checked whole
(anything damaged reads as none saved: the run measures again).
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from training.runtime import DTYPES
from training.writes import could_not_write

CHOICE_FILE = "autotune.json"
MIN_GAIN = 1.05  # a candidate must beat float32 eager by 5% (timing noise on a shared machine is a few %)
UNITS = ("ms/step", "ms/call")
FLOAT32_ATTENTION = "float32 attention"  # the fused kernel on float32 copies of q, k, v (model/gpt.py)


@dataclass
class Comparison:
    """Candidates timed in turn (ms per step, each its fastest round) and the one kept: `baseline` unless
    another beat it by MIN_GAIN. A choice saved before comparisons were recorded holds one with its flat
    table of numbers and no baseline (they were not all timed together, so no ratio is drawn from them)."""

    ms_per_step: dict[str, float]  # ms per training step, or per call of what is timed (`unit`)
    baseline: str | None = None
    kept: str | None = None
    unit: str = "ms/step"  # or "ms/call": one forward and backward of the fused attention kernel

    def describe(self) -> str:
        """'bfloat16 602.3 vs float32 854.7 ms/step: 1.42x, kept' for each candidate against the baseline."""
        if self.baseline is None or len(self.ms_per_step) == 1:
            return "; ".join(f"{name} {ms:.1f} {self.unit}" for name, ms in self.ms_per_step.items())
        base = self.ms_per_step[self.baseline]
        parts = []
        for name, ms in self.ms_per_step.items():
            if name != self.baseline:
                verdict = "kept" if name == self.kept else f"not kept (under {MIN_GAIN:.2f}x)"
                parts.append(f"{name} {ms:.1f} vs {self.baseline} {base:.1f} {self.unit}: {base / ms:.2f}x, {verdict}")
        return "; ".join(parts)

    @classmethod
    def from_json(cls, d: Any) -> "Comparison":
        ms = d.get("ms_per_step") if isinstance(d, dict) else None
        if not (isinstance(ms, dict) and ms and all(isinstance(k, str) and _real(v) and v > 0 for k, v in ms.items())):
            raise ValueError(f"ms_per_step is not a table of positive timings: {str(ms)[:120]}")
        baseline, kept, unit = d.get("baseline"), d.get("kept"), d.get("unit", "ms/step")
        if not ((baseline is None and kept is None) or (baseline in ms and kept in ms)):
            raise ValueError(f"baseline {str(baseline)[:40]!r} / kept {str(kept)[:40]!r} are not among the timings")
        if unit not in UNITS:
            raise ValueError(f"unit {str(unit)[:40]!r} is not one of {', '.join(UNITS)}")
        return cls(ms_per_step={k: float(v) for k, v in ms.items()}, baseline=baseline, kept=kept, unit=unit)


@dataclass
class Choice:
    """What `auto` settled on, and the comparisons behind it, in the order they were made."""

    dtype: str  # "float32" | "bfloat16" | "float16" (the autocast dtype; weights stay float32)
    compile: bool
    comparisons: list[Comparison] = field(default_factory=list)
    compile_seconds: float | None = None
    note: str = ""  # why a candidate was skipped or failed
    # the fused attention kernel in the chosen lower-precision dtype against the same on float32 copies (None:
    # not measured -- float32 chosen, the from-scratch path, or dtype set explicitly)
    attention: Comparison | None = None

    @property
    def attention_float32(self) -> bool:
        """Whether the fused attention kernel runs on float32 copies of q, k, v (it measured faster)."""
        return self.attention is not None and self.attention.kept == FLOAT32_ATTENTION

    def summary(self) -> str:
        """One line for the run's log: the choice, then each comparison with the numbers it was decided on."""
        parts = [c.describe() for c in self.comparisons]
        if self.attention is not None:
            parts.insert(1, self.attention.describe())  # after the dtype comparison it was measured in
        if self.compile_seconds is not None:
            parts.append(f"compile took {self.compile_seconds:.0f} s")
        measured = "; ".join(parts) if parts else "nothing measured"
        return (f"auto: dtype {self.dtype}, compile {'on' if self.compile else 'off'} "
                f"({measured}{'; ' + self.note if self.note else ''})")

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, d: dict) -> "Choice":
        """The saved choice, checked whole (a ValueError on anything else: the run then measures again). A
        file of the earlier layout (one flat ms_per_step table) reads as one comparison without a baseline."""
        if not (isinstance(d, dict) and d.get("dtype") in DTYPES and isinstance(d.get("compile"), bool)):
            raise ValueError(f"not a dtype/compile choice: {str(d)[:120]}")
        seconds = d.get("compile_seconds")
        if not (seconds is None or (_real(seconds) and seconds >= 0)):
            raise ValueError(f"compile_seconds is not a number of seconds: {str(seconds)[:60]}")
        if "comparisons" in d:
            if not isinstance(d["comparisons"], list):
                raise ValueError(f"comparisons is not a list: {str(d['comparisons'])[:120]}")
            comparisons = [Comparison.from_json(c) for c in d["comparisons"]]
        else:  # the earlier layout
            ms = d.get("ms_per_step") or {}
            comparisons = [Comparison.from_json({"ms_per_step": ms})] if ms else []
        attention = d.get("attention")
        if attention is not None:
            attention = Comparison.from_json(attention)
            if FLOAT32_ATTENTION not in attention.ms_per_step or attention.unit != "ms/call":
                raise ValueError(f"attention is not a fused-attention comparison: {str(d['attention'])[:120]}")
        return cls(dtype=d["dtype"], compile=d["compile"], comparisons=comparisons, compile_seconds=seconds,
                   note=str(d.get("note", "")), attention=attention)


def _real(value) -> bool:
    """A finite int or float (JSON's numbers; not a bool, which Python counts as an int)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def saved_choice(out_dir: Path) -> Choice | None:
    """The choice a previous run of this out_dir made, or None (none saved, or unreadable: measure again)."""
    path = Path(out_dir) / CHOICE_FILE
    try:
        return Choice.from_json(json.loads(path.read_text(encoding="utf-8")))
    except (OSError, ValueError, TypeError):
        return None


def save_choice(out_dir: Path, choice: Choice) -> None:
    """Written by the run that owns out_dir (holding its lock), atomically (temp file + rename)."""
    path = Path(out_dir) / CHOICE_FILE
    tmp = path.with_name(f".{CHOICE_FILE}.tmp")
    with could_not_write(path, out_dir):
        tmp.write_text(json.dumps(choice.to_json(), indent=2))
        os.replace(tmp, path)
