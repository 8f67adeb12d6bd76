"""Heads over training: the induction score of every head against the step, the ICL score below it, and
the phase change the two show.

Olsson et al. 2022 ("In-context Learning and Induction Heads") saw induction heads form in a sudden phase
change, at the step where the in-context-learning score drops. A training run records both (the attention
monitor's stats.csv rows and the evals' val/icl_score); this module turns them into one picture and one
sentence. Plain rows in, no training code: any (step, layer, head, score) table can be drawn.

The phase change (`phase_change`): the first snapshot at which the largest induction score of any head
reaches PHASE_THRESHOLD (0.5: past every role threshold, halfway to a formed head's 0.9+) after a snapshot
below it. A run whose first snapshot is already past it (a model that had its induction heads before the
run) has none; so has one that never reaches it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np

from insight.heatmap import save_png
from insight.roles import ROLE_THRESHOLDS

PHASE_THRESHOLD = 0.5
NAMED_HEADS = 12  # heads named in the legend (the highest final scores); the others are drawn thin and grey
SUMMARY_HEADS = 5  # induction heads named in the summary line


@dataclass(frozen=True)
class PhaseChange:
    """The snapshot `step` at which the largest induction score first reached the threshold, and the
    snapshot before it (`before_step`, where it was `before_score`); `score` is the largest at `step`."""
    step: int
    score: float
    before_step: int
    before_score: float


def head_series(rows: Iterable[Sequence]) -> tuple[np.ndarray, dict[tuple[int, int], np.ndarray]]:
    """(steps (S,) ascending, {(layer, head): scores (S,)}) from rows (step, layer, head, score); a head
    missing at a step, or a score that is not a number, is NaN there. A later row for the same (step, layer,
    head) replaces an earlier one."""
    table: dict[tuple[int, int], dict[int, float]] = {}
    steps: set[int] = set()
    for step, layer, head, score in rows:
        step = int(step)
        steps.add(step)
        try:
            value = float(score)
        except (TypeError, ValueError):
            value = math.nan
        table.setdefault((int(layer), int(head)), {})[step] = value
    ordered = np.array(sorted(steps), dtype=np.int64)
    series = {key: np.array([values.get(int(s), math.nan) for s in ordered]) for key, values in sorted(table.items())}
    return ordered, series


def phase_change(steps: Sequence[int], max_scores: Sequence[float],
                 threshold: float = PHASE_THRESHOLD) -> PhaseChange | None:
    """The phase change (module doc) in the largest induction score of each snapshot: steps (S,) ascending,
    max_scores (S,) (NaN counts as below). None when the first snapshot is already past the threshold or
    no snapshot reaches it."""
    steps = [int(s) for s in steps]
    scores = [float(s) for s in max_scores]
    if len(steps) != len(scores):
        raise ValueError(f"{len(steps)} steps but {len(scores)} scores")
    above = [score >= threshold for score in scores]  # NaN: False
    if not any(above) or above[0]:
        return None
    k = above.index(True)
    return PhaseChange(steps[k], scores[k], steps[k - 1], scores[k - 1])


def induction_heads(series: dict[tuple[int, int], np.ndarray]) -> list[tuple[int, int, float]]:
    """(layer, head, last score) of every head whose last induction score passes the role threshold,
    highest first."""
    threshold = ROLE_THRESHOLDS["induction"]
    found = [(layer, head, float(values[-1])) for (layer, head), values in series.items()
             if len(values) and values[-1] > threshold]
    return sorted(found, key=lambda item: (-item[2], item[0], item[1]))


def score_text(value: float, threshold: float) -> str:
    """`value` to two decimals, or to as many more as it takes for the number shown to lie on the same side of
    `threshold` as the value does: a head scoring 0.3996 is "0.3996" beside "none above 0.4", never "0.40"."""
    for digits in range(2, 18):
        text = f"{value:.{digits}f}"
        shown = float(text)
        if (shown > threshold) == (value > threshold) and (shown < threshold) == (value < threshold):
            return text
    return repr(value)


def induction_summary(rows: Iterable[Sequence], icl: Iterable[tuple[int, float]]) -> str:
    """One line on the run's induction heads and phase change, e.g.
    "induction heads: L1.H2 (0.97), L1.H0 (0.93); phase change at step 140 (largest induction score 0.08 at
    step 120 -> 0.91; ICL score -0.02 at step 100 -> -2.90 at step 300)": the heads whose last score passes
    the induction role threshold, the phase change (`phase_change`), and the ICL score from the first eval to
    the last. rows: (step, layer, head, induction score); icl: (step, val ICL score) of the evals."""
    steps, series = head_series(rows)
    icl = sorted((int(s), float(v)) for s, v in icl)
    if not len(steps):
        return "induction heads: no attention snapshot yet"
    threshold = ROLE_THRESHOLDS["induction"]
    heads = induction_heads(series)
    if heads:
        named = ", ".join(f"L{layer}.H{head} ({score_text(score, threshold)})"
                          for layer, head, score in heads[:SUMMARY_HEADS])
        more = f" and {len(heads) - SUMMARY_HEADS} more" if len(heads) > SUMMARY_HEADS else ""
        text = f"induction heads: {named}{more}"
    else:
        last = {key: values[-1] for key, values in series.items() if np.isfinite(values[-1])}
        best = max(last, key=last.get) if last else None
        largest_text = f"(largest L{best[0]}.H{best[1]} {score_text(last[best], threshold)})" if best else "(no score)"
        text = f"induction heads: none above {threshold} {largest_text}"
    largest = _largest(series)
    change = phase_change(steps, largest)
    if change is None:
        if largest[0] >= PHASE_THRESHOLD:
            return text + (f"; no phase change in this run (largest induction score "
                           f"{score_text(largest[0], PHASE_THRESHOLD)} at its first snapshot, step {int(steps[0])})")
        return text + f"; no phase change (largest induction score stayed below {PHASE_THRESHOLD})"
    text += (f"; phase change at step {change.step} (largest induction score "
             f"{score_text(change.before_score, PHASE_THRESHOLD)} at step {change.before_step} -> "
             f"{score_text(change.score, PHASE_THRESHOLD)}")
    if len(icl) >= 2:  # from the first eval to the last: the drop the phase change brings
        text += f"; ICL score {icl[0][1]:.2f} at step {icl[0][0]} -> {icl[-1][1]:.2f} at step {icl[-1][0]}"
    return text + ")"


def _largest(series: dict[tuple[int, int], np.ndarray]) -> np.ndarray:
    """(S,) the largest score over heads at each step (NaN where no head has one)."""
    stacked = np.stack(list(series.values()))  # (heads, S)
    finite = np.where(np.isfinite(stacked), stacked, -np.inf)
    best = finite.max(axis=0)
    return np.where(np.isfinite(best), best, np.nan)


def draw_heads_over_training(rows: Iterable[Sequence], icl: Iterable[tuple[int, float]],
                             path: str | Path | None = None, title: str = "heads over training") -> "Figure":
    """The picture: top, a line per head (label L.H) of its induction score against the step, the role
    threshold dashed and the phase change (if any) marked; bottom, the val ICL score against the step.
    rows: (step, layer, head, induction score); icl: (step, score). At most NAMED_HEADS heads, those with
    the highest last score, are coloured and named; the others are thin grey lines. Returns the Figure (a
    pyplot-free Agg figure), also saved as a PNG when path is given: whole, through `save_png`."""
    from matplotlib import colormaps
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    steps, series = head_series(rows)
    icl = sorted((int(s), float(v)) for s, v in icl)
    fig = Figure(figsize=(8.0, 6.0), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    top, bottom = fig.subplots(2, 1, sharex=True, height_ratios=(2.2, 1.0))
    ranked = sorted(series, key=lambda key: -np.nan_to_num(series[key][-1], nan=-1.0))
    named = set(ranked[:NAMED_HEADS])
    palette = colormaps["tab20" if len(named) > 10 else "tab10"]
    for key in reversed(ranked):  # named heads drawn last, on top
        values = series[key]
        if key in named:
            top.plot(steps, values, marker="o", markersize=2.5, linewidth=1.5,
                     color=palette(ranked.index(key) % palette.N), label=f"{key[0]}.{key[1]}")
        else:
            top.plot(steps, values, linewidth=0.6, color="0.75")
    top.axhline(ROLE_THRESHOLDS["induction"], color="0.4", linestyle="--", linewidth=0.8)
    top.set(ylim=(-0.02, 1.02), ylabel="induction score", title=title)
    change = phase_change(steps, _largest(series)) if series else None
    if change is not None:
        for axis in (top, bottom):
            axis.axvline(change.step, color="tab:red", linewidth=0.9, alpha=0.7)
        top.annotate(f"phase change, step {change.step}", (change.step, 0.03), xytext=(4, 0),
                     textcoords="offset points", color="tab:red", fontsize=8)
    if named:
        top.legend(title="layer.head", fontsize=7, title_fontsize=7, ncols=2 if len(named) > 6 else 1,
                   loc="center left", bbox_to_anchor=(1.0, 0.5))
    if icl:
        bottom.plot([s for s, _ in icl], [v for _, v in icl], marker="o", markersize=2.5, color="black")
    bottom.axhline(0.0, color="0.6", linewidth=0.6)
    bottom.set(ylabel="val ICL score (nats)", xlabel="step")
    return save_png(fig, path)
