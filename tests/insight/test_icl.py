"""The in-context-learning score (insight/icl.py): its windows for every length, and its value on constructed
per-position losses against an explicit computation."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from insight.ablation import token_losses
from insight.icl import icl_positions, icl_score
from model import GPT, ModelConfig


@pytest.mark.parametrize("T,early,late", [
    (1, (0, 1), (0, 1)),
    (2, (0, 1), (1, 2)),
    (9, (0, 1), (8, 9)),
    (10, (1, 2), (9, 10)),
    (64, (3, 9), (58, 64)),
    (255, (13, 38), (230, 255)),  # block_size 256: 255 next-token losses
    (256, (13, 38), (231, 256)),
    (512, (26, 77), (461, 512)),  # Olsson et al.'s 512 tokens: around token 50, and the last 51
])
def test_windows_at_known_lengths(T, early, late):
    e, l = icl_positions(T)
    assert (e.start, e.stop) == early and (l.start, l.stop) == late


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 20000))
def test_windows_are_equal_width_in_range_around_ten_percent_and_apart(T):
    early, late = icl_positions(T)
    width = max(1, T // 10)
    assert early.step is None and late.step is None
    assert early.stop - early.start == width == late.stop - late.start
    assert 0 <= early.start and late.stop == T
    assert early.start <= T // 10 < early.stop  # the window holds position 10% of T
    if T >= 2:
        assert early.stop <= late.start  # no position counted as both early and late


def explicit_score(losses: np.ndarray) -> float:
    T = losses.shape[1]
    width = max(1, T // 10)
    start = max(0, T // 10 - width // 2)
    early = [losses[b, i] for b in range(losses.shape[0]) for i in range(start, start + width)]
    late = [losses[b, i] for b in range(losses.shape[0]) for i in range(T - width, T)]
    return float(np.mean(late) - np.mean(early))


def test_score_on_constructed_losses():
    T = 100  # windows: early 5..14, late 90..99
    ramp = torch.arange(T, dtype=torch.float32).expand(2, T)  # loss = position
    assert icl_score(ramp) == pytest.approx(np.mean(range(90, 100)) - np.mean(range(5, 15)))  # 85
    assert icl_score(torch.full((3, T), 4.2)) == pytest.approx(0.0, abs=1e-12)
    falling = torch.full((1, T), 8.0)
    falling[0, 90:] = 0.5  # the second half of a repeated sequence: nearly free once it is recognised
    assert icl_score(falling) == pytest.approx(-7.5)
    outside = torch.full((1, T), 3.0)
    outside[0, 15:90] = 100.0  # positions in neither window do not count
    outside[0, :5] = -50.0
    assert icl_score(outside) == pytest.approx(0.0, abs=1e-12)
    assert icl_score(ramp[0]) == icl_score(ramp)  # (T,) is one sequence
    assert icl_score(torch.ones(1, 1)) == 0.0


@settings(max_examples=50, deadline=None)
@given(st.integers(1, 4), st.integers(1, 300), st.integers(0, 2**31 - 1))
def test_score_equals_an_explicit_mean_on_random_losses(B, T, seed):
    losses = np.random.default_rng(seed).exponential(3.0, size=(B, T))
    assert icl_score(torch.from_numpy(losses)) == pytest.approx(explicit_score(losses), abs=1e-9)
    assert icl_score(losses) == pytest.approx(explicit_score(losses), abs=1e-9)  # numpy accepted


def test_bad_shapes_are_refused():
    with pytest.raises(ValueError, match="at one position"):
        icl_positions(0)
    with pytest.raises(ValueError, match=r"\(B, T\) or \(T,\)"):
        icl_score(torch.ones(2, 3, 4))
    with pytest.raises(ValueError, match="at one position"):
        icl_score(torch.ones(2, 0))


def test_score_of_a_model_from_its_token_losses():
    torch.manual_seed(0)
    model = GPT(ModelConfig(vocab_size=30, block_size=40, n_layer=2, n_head=2, d_model=16))
    idx = torch.randint(0, 30, (2, 40))
    losses = token_losses(model, idx)  # (2, 39)
    assert icl_score(losses) == pytest.approx(explicit_score(losses.double().numpy()), abs=1e-6)
