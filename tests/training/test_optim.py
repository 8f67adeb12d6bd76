"""lr_factor where cooldown_frac × lr_decay_iters is not a whole number of steps: the cooldown lasts the
nearest whole number of steps (a tie to the even one, as Python's round), at least one step and never inside
the warmup, and the boundary steps of each phase get exactly the factor of the formula written out here."""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers import tiny_config
from training.optim import lr_factor


def wsd(step: int, warmup: int, decay_iters: int, cooldown_steps: int, min_factor: float) -> float:
    """Linear warmup from 1/warmup, the peak until decay_iters - cooldown_steps (or the warmup's end if later),
    then a straight line reaching min_factor at decay_iters, min_factor after it."""
    if step < warmup:
        return (step + 1) / warmup
    if step >= decay_iters:
        return min_factor
    start = max(warmup, decay_iters - cooldown_steps)
    if step < start:
        return 1.0
    return 1.0 - (1.0 - min_factor) * (step - start) / (decay_iters - start)


@pytest.mark.parametrize("frac, decay_iters, warmup, cooldown_steps", [
    (0.33, 10, 2, 3),   # 3.3 steps: 3
    (0.37, 10, 2, 4),   # 3.7 steps: 4
    (0.25, 10, 2, 2),   # 2.5 steps: a tie, to the even 2
    (0.35, 10, 2, 4),   # 3.5 (3.5000000000000004 in floats): 4
    (0.04, 10, 0, 1),   # 0.4 steps: never under one step
    (0.95, 10, 3, 7),   # 9.5 steps (10) would start inside the warmup: it starts at the warmup's end
])
def test_a_fractional_cooldown_starts_and_ends_where_the_formula_says(frac, decay_iters, warmup, cooldown_steps):
    tc = tiny_config(Path("unused"), "train.lr=1e-3", "train.min_lr=1e-4", "train.lr_schedule=wsd",
                     f"train.cooldown_frac={frac}", f"train.lr_decay_iters={decay_iters}",
                     f"train.warmup_iters={warmup}", "train.max_iters=12").train
    for step in range(13):
        assert lr_factor(step, tc) == pytest.approx(wsd(step, warmup, decay_iters, cooldown_steps, 0.1),
                                                    rel=1e-12, abs=1e-15), step
    start = max(warmup, decay_iters - cooldown_steps)
    assert lr_factor(start - 1, tc) == 1.0 or start - 1 < warmup  # the last step at the peak
    assert lr_factor(start, tc) == 1.0 and lr_factor(start + 1, tc) < 1.0  # the cooldown's first step is the peak
    assert lr_factor(decay_iters - 1, tc) > 0.1 and lr_factor(decay_iters, tc) == pytest.approx(0.1, rel=1e-12)
