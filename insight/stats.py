"""Per-head statistics of attention maps: what the attention of a trained GPT looks like, in numbers.

`GPT.attention_maps` returns causal weights (B, n_head, T, T). A picture of every head of every layer
is too much to read at every logging step, so this module boils each head down to a few numbers that
can be logged during training (cheap, vectorised, on whatever device the weights live).

Statistics (all per head; row i is query position i, which sees keys j <= i):
  entropy        mean over queries of H(row i) / log(i + 1): 1 = uniform over the visible keys, 0 = one key.
  sink_mass      mean over queries of w[i, 0]: how much attention is parked on the first token.
  mean_distance  mean over queries of sum_j w[i, j] (i - j), in tokens.
  decay_gamma    gamma of the power law m(d) ~ d**(-gamma), m(d) = mean weight at distance d = i - j over
                 the keys j >= 1 (key 0 left out, below).
  decay_r2       R² of that log-log fit: 1 = m(d) is exactly a power law, near 0 = gamma describes little.
Query row 0 sees only key 0 (its entropy is 0/0, its sink mass is always 1, its distance always 0),
so it carries no information: all three per-row means are over rows 1..T-1 (NaN when T == 1).

Why the decay fit never sees key 0: key 0 sits at distance i from query i, so an attention sink puts its
weight on every distance once, at the one query that reaches it there. In m(d), the mean over the T - d
queries that reach distance d, the sink's share is sink / (T - d): negligible at short distances, but it
grows toward the longest ones, which only a few queries reach (d = T - 1 only through key 0), and it
dominates them for any sink above the head's ordinary weight there (sink 0.3 against a 1/d head at
T = 256, d = 200: 0.005 against 0.001). A sink is a different thing from decay, reported apart as sink_mass,
so the profile of keys j >= 1 is fitted, for every head: one rule, no jump when a head's sink grows past
some threshold during training.
"""
from __future__ import annotations

from typing import Union

import numpy as np
import torch

ArrayLike = Union[torch.Tensor, np.ndarray]

STAT_NAMES = ("entropy", "sink_mass", "mean_distance", "decay_gamma", "decay_r2")


def _as_maps(weights: ArrayLike) -> torch.Tensor:
    """(n_head, T, T) or (B, n_head, T, T) -> (B, n_head, T, T), float32 or wider, detached."""
    w = torch.as_tensor(weights).detach()
    if w.dim() == 3:
        w = w.unsqueeze(0)
    if w.dim() != 4 or w.shape[-1] != w.shape[-2]:
        raise ValueError(f"attention weights must be (n_head, T, T) or (B, n_head, T, T), got {tuple(w.shape)}")
    return w.to(torch.promote_types(w.dtype, torch.float32))


def _row_mean(per_row: torch.Tensor) -> np.ndarray:
    """(B, n_head, T) per-query values -> (n_head,): mean over rows 1..T-1, then over the batch."""
    if per_row.shape[-1] < 2:
        return np.full(per_row.shape[1], np.nan)
    return per_row[..., 1:].mean(dim=(0, 2)).double().cpu().numpy()


def attention_entropy(weights: ArrayLike) -> np.ndarray:
    """Normalised attention entropy per head, (n_head,): row i's -sum_j w_ij log w_ij (0 log 0 = 0) over log(i + 1),
    uniform attention's over the i + 1 visible keys, averaged over query rows 1..T-1 (row 0 has log 1 = 0) and
    the batch. 1 = uniform, 0 = all weight on one key."""
    w = _as_maps(weights)  # (B, H, T, T)
    h = -torch.special.xlogy(w, w).sum(dim=-1)  # (B, H, T) in nats
    norm = torch.log(torch.arange(1, w.shape[-1] + 1, device=w.device, dtype=w.dtype)).clamp_min(1e-30)  # log(i+1)
    return _row_mean(h / norm)


def sink_mass(weights: ArrayLike) -> np.ndarray:
    """Mean weight on key 0 per head, (n_head,), over query rows 1..T-1 (row 0's is always 1) and the batch."""
    return _row_mean(_as_maps(weights)[..., :, 0])  # (B, H, T)


def mean_distance(weights: ArrayLike) -> np.ndarray:
    """Mean attention distance in tokens per head, (n_head,): sum_j w_ij (i - j), averaged over query
    rows 1..T-1 (row 0's is always 0) and the batch. Uniform causal attention gives i/2 on row i."""
    w = _as_maps(weights)
    pos = torch.arange(w.shape[-1], device=w.device, dtype=w.dtype)  # (T,)
    dist = pos * w.sum(dim=-1) - w @ pos  # (B, H, T): i * sum_j w_ij - sum_j w_ij j
    return _row_mean(dist)


def distance_profile(weights: ArrayLike, skip_first_key: bool = False) -> np.ndarray:
    """m(d) per head, (n_head, T): mean over the batch and over queries i >= d of w[i, i - d], d = 0..T-1.
    skip_first_key: leave key 0 out, so m(d) is the mean over queries i >= d + 1 (key i - d >= 1); m(T - 1),
    which only key 0 reaches, is then NaN."""
    w = _as_maps(weights)
    B, H, T, _ = w.shape
    i = torch.arange(T, device=w.device)
    d = i[:, None] - i[None, :]  # (T, T): distance i - j
    d = torch.where(d >= 0, d, torch.full_like(d, T))  # the future goes to an overflow bin T
    if skip_first_key:
        d[:, 0] = T  # key 0 too
    sums = torch.zeros(H, T + 1, device=w.device, dtype=w.dtype)
    sums.scatter_add_(1, d.reshape(1, T * T).expand(H, -1), w.sum(dim=0).reshape(H, T * T))  # (H, T+1)
    reach = T - torch.arange(T, device=w.device) - int(skip_first_key)  # (T,): queries that reach distance d
    counts = (B * reach).to(w.dtype)
    profile = sums[:, :T] / counts.clamp_min(1)
    profile[:, reach <= 0] = float("nan")
    return profile.double().cpu().numpy()


def _log_log_fit(weights: ArrayLike) -> tuple[np.ndarray, np.ndarray]:
    """(gamma, R²) per head of the least-squares fit log m(d) = c - gamma log d over d = 1..T-2, m the
    distance profile of keys j >= 1 (module doc), distances with m(d) <= 0 or not finite skipped."""
    m = distance_profile(weights, skip_first_key=True)[:, 1:]  # (H, T-1): d = 1..T-1 (the last one NaN)
    x = np.log(np.arange(1, m.shape[1] + 1, dtype=np.float64))  # (T-1,)
    ok = np.isfinite(m) & (m > 0)  # (H, T-1)
    y = np.log(np.where(ok, m, 1.0))
    n = ok.sum(axis=1)  # (H,)
    safe_n = np.maximum(n, 1)
    x_mean = (ok * x).sum(axis=1) / safe_n
    y_mean = (ok * y).sum(axis=1) / safe_n
    dx = np.where(ok, x - x_mean[:, None], 0.0)
    dy = np.where(ok, y - y_mean[:, None], 0.0)
    sxx, syy, sxy = (dx * dx).sum(axis=1), (dy * dy).sum(axis=1), (dx * dy).sum(axis=1)
    fitted = (n >= 2) & (sxx > 0)
    slope = sxy / np.where(sxx > 0, sxx, 1.0)
    # R² = 1 - residual / total sum of squares = sxy² / (sxx syy); a flat profile (syy = 0) is fitted exactly
    r2 = np.where(syy > 0, sxy * sxy / np.where(sxx * syy > 0, sxx * syy, 1.0), 1.0)
    return np.where(fitted, -slope, np.nan), np.where(fitted, r2, np.nan)


def decay_exponent(weights: ArrayLike) -> np.ndarray:
    """Power-law decay exponent gamma per head, (n_head,), positive when attention decays with distance: the
    fit of `_log_log_fit`, to the profile pooled over the batch (why key 0 is left out: module doc); weights
    ~ d**-2 give gamma = 2. NaN for a head with fewer than 2 usable distances."""
    return _log_log_fit(weights)[0]


def decay_r2(weights: ArrayLike) -> np.ndarray:
    """R² of decay_exponent's log-log fit per head, (n_head,) in [0, 1]: the share of the variance of
    log m(d) that the line explains. 1 for an exact power law (and for a flat profile, fitted exactly by
    gamma = 0); NaN where gamma is NaN."""
    return _log_log_fit(weights)[1]


def head_stats(weights: ArrayLike) -> dict[str, np.ndarray]:
    """All of STAT_NAMES for weights (n_head, T, T) or (B, n_head, T, T): {name: (n_head,) float64}.

    entropy, sink_mass and mean_distance are the batch mean of the per-item values; decay_gamma and
    decay_r2 come from one fit to the distance profile pooled over the batch (steadier than averaging B fits)."""
    w = _as_maps(weights)
    gamma, r2 = _log_log_fit(w)
    return {"entropy": attention_entropy(w), "sink_mass": sink_mass(w),
            "mean_distance": mean_distance(w), "decay_gamma": gamma, "decay_r2": r2}
