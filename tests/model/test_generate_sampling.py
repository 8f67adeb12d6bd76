"""The sampling filters of model/generate.py's sample_next: temperature, top-k, top-p.

Draws many samples from fixed logits with a seeded generator and checks the candidate sets exactly and
the frequencies statistically (tolerances in assert_frequencies)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from hypothesis import given, settings
from hypothesis import strategies as st

from model.generate import draw_proportional, sample_next



def draw(logits: list[float] | torch.Tensor, n: int, seed: int = 0, **kwargs) -> torch.Tensor:
    """n independent draws from the same logits: one batched sample_next call over n identical rows."""
    row = torch.as_tensor(logits, dtype=torch.float32)
    return sample_next(row.expand(n, -1), generator=torch.Generator().manual_seed(seed), **kwargs)


def assert_frequencies(samples: torch.Tensor, probs: torch.Tensor) -> None:
    """Each token's observed frequency within 5 binomial standard deviations, sqrt(p(1-p)/n), of its
    probability: a correct sampler fails this with probability < 1e-5 per token (and the seed is fixed);
    a sampler that ignores the temperature or a filter is off by several percent, > 10 sigma here."""
    n = samples.numel()
    freq = torch.bincount(samples, minlength=probs.numel()).double() / n
    tolerance = 5 * torch.sqrt(probs * (1 - probs) / n) + 1e-12
    assert ((freq - probs).abs() <= tolerance).all(), f"frequencies {freq.tolist()} vs probabilities {probs.tolist()}"


def test_temperature_zero_is_argmax_whatever_the_filters():
    logits = torch.randn(16, 50, generator=torch.Generator().manual_seed(0))
    logits[3, 7] = logits[3, 9] = logits[3].max() + 1  # a tie: the first index wins, as in torch.argmax
    expected = logits.argmax(dim=-1)
    assert int(expected[3]) == 7
    assert torch.equal(sample_next(logits, temperature=0.0), expected)
    assert torch.equal(sample_next(logits, temperature=0.0, top_k=3, top_p=0.5), expected)


@settings(max_examples=150, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), rows=st.integers(1, 3), vocab=st.integers(1, 60_000),
       spread=st.integers(1, 6), dtype=st.sampled_from([torch.float32, torch.bfloat16, torch.float16, torch.float64]),
       with_inf=st.booleans())
def test_greedy_picks_the_first_largest_logit_in_any_dtype(seed, rows, vocab, spread, dtype, with_inf):
    """Greedy decoding is argmax on the widened row, the lowest index among ties, for rows of few distinct
    values (ties everywhere), -inf entries, any vocabulary size (the kernels' vector loops and their tails)."""
    logits = torch.randint(-spread, spread + 1, (rows, vocab), generator=torch.Generator().manual_seed(seed)).float()
    if with_inf:
        logits[logits < 0] = float("-inf")
    logits = logits.to(dtype)
    assert torch.equal(sample_next(logits, temperature=0.0), logits.double().argmax(dim=-1))


def test_top_k_keeps_exactly_k_candidates_even_with_ties():
    """Five tokens tie for second place: top_k=3 keeps the best and exactly two of the tied ones (the
    lowest indices), never all five as a `logits >= kth value` filter would."""
    logits = [0.0, 2.0, 2.0, 3.0, 2.0, 2.0, 2.0, 1.0]
    for k, expected in [(1, {3}), (3, {1, 2, 3}), (6, {1, 2, 3, 4, 5, 6})]:
        samples = draw(logits, 4000, top_k=k, temperature=1.0)
        assert set(samples.tolist()) == expected
    every_tied = draw([1.0] * 10, 4000, top_k=4, temperature=1.0)
    assert set(every_tied.tolist()) == {0, 1, 2, 3}
    assert_frequencies(every_tied, torch.tensor([0.25] * 4 + [0.0] * 6, dtype=torch.float64))


def test_top_k_renormalises_over_its_candidates():
    logits = torch.tensor([0.5, -1.0, 1.5, 0.0, 1.0, -2.0], dtype=torch.float64)
    samples = draw(logits, 20000, top_k=3, temperature=0.7)
    kept = torch.tensor([0, 2, 4])
    probs = torch.zeros(6, dtype=torch.float64)
    probs[kept] = torch.softmax(logits[kept] / 0.7, dim=0)
    assert set(samples.tolist()) == {0, 2, 4}
    assert_frequencies(samples, probs)


def nucleus(probs: np.ndarray, top_p: float) -> set[int]:
    """The smallest set of most likely tokens whose total probability reaches top_p (written independently
    of sample_next: count the tokens needed, in order of probability)."""
    order = np.argsort(-probs, kind="stable")
    total, chosen = 0.0, set()
    for token in order:
        chosen.add(int(token))
        total += probs[token]
        if total >= top_p:
            break
    return chosen


@pytest.mark.parametrize("top_p,expected", [(0.3, {1}), (0.6, {1, 3}), (0.75, {1, 3, 4}), (0.9, {1, 2, 3, 4}),
                                            (1.0, {0, 1, 2, 3, 4})])
def test_top_p_keeps_the_smallest_nucleus(top_p, expected):
    """Probabilities 0.4, 0.3, 0.15, 0.1, 0.05 (tokens 1, 3, 4, 2, 0): mass 0.4, 0.7, 0.85, 0.95, 1."""
    probs = np.array([0.05, 0.4, 0.1, 0.3, 0.15])
    assert nucleus(probs, top_p) == expected
    samples = draw(np.log(probs).tolist(), 20000, top_p=top_p, temperature=1.0)
    assert set(samples.tolist()) == expected
    renormalised = torch.zeros(5, dtype=torch.float64)
    kept = sorted(expected)
    renormalised[kept] = torch.tensor(probs[kept] / probs[kept].sum())
    assert_frequencies(samples, renormalised)


@pytest.mark.parametrize("top_p, kept", [(0.5, 32), (0.75, 48), (0.5 + 1e-9, 33)])
def test_top_p_stops_when_the_mass_reaches_p_and_breaks_ties_by_index(top_p, kept):
    """64 equally likely tokens (1/64 each, exact in float64): top_p 0.5 is reached by 32 of them, so exactly
    32 stay (a nucleus that must *exceed* p would keep 33); which ones is decided as top_k decides ties, the
    lowest indices (an unstable sort orders 64 ties otherwise)."""
    samples = draw([0.0] * 64, 8000, top_p=top_p, temperature=1.0)
    assert set(samples.tolist()) == set(range(kept))


def test_top_p_never_draws_outside_the_nucleus_of_random_logits():
    gen = torch.Generator().manual_seed(5)
    for trial in range(5):
        logits = torch.randn(40, generator=gen, dtype=torch.float64) * 2
        probs = torch.softmax(logits, dim=0).numpy()
        for top_p in (0.5, 0.9):
            allowed = nucleus(probs, top_p)
            drawn = set(draw(logits, 3000, seed=trial, top_p=top_p, temperature=1.0).tolist())
            assert drawn <= allowed
            likely = {t for t in allowed if probs[t] / probs[sorted(allowed)].sum() > 0.01}
            assert likely <= drawn, "a nucleus member with > 1% of the mass was never drawn in 3000 tries"


def test_top_k_then_top_p_takes_the_nucleus_among_the_k():
    probs = np.array([0.05, 0.4, 0.1, 0.3, 0.15])
    # top_k=2 leaves tokens 1, 3 renormalised to 4/7, 3/7; top_p=0.5 needs only token 1
    assert set(draw(np.log(probs).tolist(), 2000, top_k=2, top_p=0.5, temperature=1.0).tolist()) == {1}
    assert set(draw(np.log(probs).tolist(), 2000, top_k=3, top_p=0.8, temperature=1.0).tolist()) == {1, 3}


@pytest.mark.parametrize("temperature", [1.0, 0.5, 2.0])
def test_sample_frequencies_match_the_tempered_softmax(temperature):
    logits = torch.tensor([1.0, 0.0, -0.5, 2.0, 0.3, -1.0], dtype=torch.float64)
    samples = draw(logits, 20000, seed=7, temperature=temperature)
    assert_frequencies(samples, torch.softmax(logits / temperature, dim=0))


@pytest.mark.parametrize("temperature", [1e-40, 1e-308])
def test_tiny_temperature_is_near_greedy_not_nan(temperature):
    """logits / 1e-40 overflow float32, and / 1e-308 overflow even float64 unless the row's max is taken off
    first; sample_next must still draw the argmax, not crash on NaN."""
    logits = torch.tensor([[5.0, 1.0, -3.0, 4.0], [0.0, 0.0, 7.0, -1.0]])
    assert sample_next(logits, temperature=temperature).tolist() == [0, 2]


def test_draw_proportional_matches_the_weights_and_never_draws_a_zero():
    weights = torch.tensor([[0.0, 3.0, 0.0, 1.0, 0.0, 4.0, 0.0]], dtype=torch.float64)
    samples = draw_proportional(weights.expand(40000, -1), torch.Generator().manual_seed(3))
    assert set(samples.tolist()) == {1, 3, 5}
    assert_frequencies(samples, weights[0] / weights.sum())


@pytest.mark.parametrize("u_fraction, expected", [(0.0, 1), (1.0, 3)])
def test_draw_proportional_at_the_ends_of_the_uniform(monkeypatch, u_fraction, expected):
    """u = 0 draws the first token with weight (a leading zero-weight token owns the empty [0, 0)); u rounded up
    to the total, which [0, 1) x total can give in floating point, draws the last token with weight, never the
    zero-weight ones after it nor an index past the vocabulary."""
    monkeypatch.setattr(torch, "rand", lambda shape, **kw: torch.full(shape, u_fraction, dtype=kw["dtype"]))
    weights = torch.tensor([[0.0, 0.25, 0.5, 1.0, 0.0, 0.0]], dtype=torch.float64)
    assert draw_proportional(weights).tolist() == [expected]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from([0.0, 1e-300, 1e-12, 0.5, 1.0, 7.0]), min_size=1, max_size=40), st.integers(0, 99))
def test_draw_proportional_draws_only_positive_weights(values, seed):
    weights = torch.tensor([values + [1.0]], dtype=torch.float64)  # the row's largest > 0, as sample_next has it
    drawn = draw_proportional(weights.expand(64, -1), torch.Generator().manual_seed(seed))
    assert ((drawn >= 0) & (drawn < weights.shape[1])).all()
    assert (weights[0, drawn] > 0).all()
