"""Head roles: what a head's attention does, scored on inputs where the answer is known.

Three roles of the head detector of TransformerLens (`detect_head`, "mul" measure) and of Olsson et al.
2022 ("In-context Learning and Induction Heads"), each a mean attention weight on the one key the role
predicts, so 1 = the head does only that and a uniform head scores 1 / (keys it can see):

  prev_token       mean over queries i >= 1 of w[i, i - 1], on ordinary text (the probe text).
  duplicate_token  on the role probe (below): mean over the second copy's queries i = R+1..2R of w[i, i - R],
                   the earlier occurrence of the query's own token.
  induction        on the role probe: mean over the same queries of w[i, i - R + 1], the token that followed
                   that earlier occurrence (what an induction head copies forward).

TransformerLens divides by every query of the sequence (rows with no such key count 0); here the mean is
over the queries the role is defined for, so a perfect head scores 1 whatever R is.

The role probe: `role_probe` builds `batch` sequences of one start token followed by R random ordinary
tokens and the same R again, R = probe_length(block_size) = min(50, (block_size - 1) // 2):

    position  0       1 .. R          R+1 .. 2R
    token     start   t_1 .. t_R      t_1 .. t_R

Random tokens carry no meaning a head could follow instead, so attention to i - R or i - R + 1 can only
come from matching tokens. They are drawn without replacement (when the tokenizer has R ordinary ids
besides the start token) so that each token of the first copy occurs there once: i - R is then the only
earlier occurrence of query i's token. Below R = 3 (block_size < 7) a role key is the previous token
(R = 1: i - R = i - 1; R = 2: i - R + 1 = i - 1), so the scores tell the roles apart from block_size 7 on.
"""
from __future__ import annotations

from typing import Callable, Sequence

import numpy as np
import torch

from insight.ablation import eval_mode
from insight.stats import ArrayLike, _as_maps

ROLE_NAMES = ("prev_token", "duplicate_token", "induction")
# A head is labelled with a role when its score passes 0.4: well above what attention spread over the
# context gives (a uniform head scores about 1 / position), and below the 0.9+ of a formed induction head.
ROLE_THRESHOLDS = {"prev_token": 0.4, "duplicate_token": 0.4, "induction": 0.4}
ROLE_LABELS = {"induction": "induction", "prev_token": "previous-token", "duplicate_token": "duplicate-token"}
MAX_PROBE_LENGTH = 50


def probe_length(block_size: int) -> int:
    """R, the length of each copy in the role probe: min(50, (block_size - 1) // 2), so 1 + 2R <= block_size."""
    return min(MAX_PROBE_LENGTH, (int(block_size) - 1) // 2)


def role_probe(ordinary_ids: Sequence[int] | np.ndarray | torch.Tensor, start_id: int, block_size: int,
               batch: int = 8, seed: int = 0) -> torch.LongTensor:
    """The role probe (module doc): (batch, 1 + 2R) token ids, row b = start_id, t_1..t_R, t_1..t_R.

    t is drawn uniformly from ordinary_ids (start_id left out when enough others remain) by a numpy
    Generator seeded with `seed` alone: the same probe every call, whatever the global RNG state."""
    R = probe_length(block_size)
    if R < 1:
        raise ValueError(f"block_size={block_size} is too short for a role probe: it needs at least 3 positions")
    if batch < 1:
        raise ValueError(f"batch={batch}: the role probe needs at least one sequence")
    pool = np.unique(np.asarray(ordinary_ids, dtype=np.int64))
    if pool.size == 0:
        raise ValueError("the role probe needs at least one ordinary token id")
    without_start = pool[pool != start_id]
    if without_start.size >= R:
        pool = without_start
    rng = np.random.default_rng(seed)
    replace = pool.size < R  # too few ids for R distinct ones: repeats are unavoidable
    first = np.stack([rng.choice(pool, size=R, replace=replace) for _ in range(batch)])  # (batch, R)
    start = np.full((batch, 1), start_id, dtype=np.int64)
    return torch.from_numpy(np.concatenate([start, first, first], axis=1))  # (batch, 1 + 2R)


def _mean_on_diagonal(w: torch.Tensor, rows: range, offset: int) -> np.ndarray:
    """(B, H, T, T) -> (H,): mean over the batch and over query rows i in `rows` of w[i, i - offset]."""
    i = torch.arange(rows.start, rows.stop, device=w.device)  # (n,)
    picked = w[:, :, i, i - offset]  # (B, H, n)
    return picked.mean(dim=(0, 2)).double().cpu().numpy()


def prev_token_score(weights: ArrayLike) -> np.ndarray:
    """Mean w[i, i - 1] over query rows i >= 1 and the batch, per head: (n_head,) float64; weights
    (n_head, T, T) or (B, n_head, T, T). NaN when T == 1 (no row has a previous token)."""
    w = _as_maps(weights)
    T = w.shape[-1]
    if T < 2:
        return np.full(w.shape[1], np.nan)
    return _mean_on_diagonal(w, range(1, T), 1)


def _probe_maps(weights: ArrayLike, R: int) -> torch.Tensor:
    w = _as_maps(weights)
    if R < 1 or w.shape[-1] < 1 + 2 * R:
        raise ValueError(f"role-probe maps of {w.shape[-1]} positions do not hold a probe with R={R}: "
                         f"it needs 1 + 2R positions (start token, two copies of R tokens)")
    return w


def duplicate_token_score(weights: ArrayLike, R: int) -> np.ndarray:
    """Mean w[i, i - R] over the second copy's queries i = R+1..2R of the role probe and the batch, per
    head: (n_head,) float64. weights: the probe's maps, (n_head, T, T) or (B, n_head, T, T), T >= 1 + 2R."""
    return _mean_on_diagonal(_probe_maps(weights, R), range(R + 1, 2 * R + 1), R)


def induction_score(weights: ArrayLike, R: int) -> np.ndarray:
    """Mean w[i, i - R + 1] over the second copy's queries i = R+1..2R of the role probe and the batch, per
    head: (n_head,) float64, the token after the earlier occurrence of query i's token. For R = 1 that key
    is the query itself (i - R + 1 = i)."""
    return _mean_on_diagonal(_probe_maps(weights, R), range(R + 1, 2 * R + 1), R - 1)


def role_label(prev: float, dup: float, ind: float) -> str:
    """The role a head's scores name: "induction", "previous-token" or "duplicate-token" when that score
    exceeds its ROLE_THRESHOLDS entry, tried in that order (an induction head usually also looks like a
    weaker duplicate head; induction is the rarer, more specific finding); "" for none. NaN passes nothing."""
    for name, score in (("induction", ind), ("prev_token", prev), ("duplicate_token", dup)):
        if score > ROLE_THRESHOLDS[name]:  # False for NaN
            return ROLE_LABELS[name]
    return ""


MAPS_BUDGET_BYTES = 256 * 2**20  # attention maps of all layers held at once by head_role_scores


@torch.no_grad()
def head_role_scores(model, text_idx: torch.Tensor, probe_idx: torch.Tensor) -> dict[str, np.ndarray]:
    """{role: (n_layer, n_head) float64} for every role of ROLE_NAMES: prev_token on text_idx (B, T),
    duplicate_token and induction on probe_idx (B, 1 + 2R), a `role_probe`. The maps come from the
    from-scratch path in eval mode (GPT.attention_maps; the model's mode is restored afterwards), a few
    sequences at a time so that the maps of all layers held at once stay within MAPS_BUDGET_BYTES."""
    for name, idx in (("text_idx", text_idx), ("probe_idx", probe_idx)):
        if idx.dim() != 2 or idx.shape[0] < 1 or idx.shape[1] < 2:
            raise ValueError(f"{name} must be (B, T) token ids with B >= 1 and T >= 2, got {tuple(idx.shape)}")
    scores = _mean_scores(model, text_idx, {"prev_token": prev_token_score})
    scores.update(probe_role_scores(model, probe_idx))
    return {name: scores[name] for name in ROLE_NAMES}


@torch.no_grad()
def probe_role_scores(model, probe_idx: torch.Tensor) -> dict[str, np.ndarray]:
    """{"duplicate_token": (n_layer, n_head), "induction": (n_layer, n_head)} float64 on probe_idx (B, 1 + 2R),
    a `role_probe`: the two roles head_role_scores measures on the probe, for a caller that has its text's
    maps already (prev_token needs only those)."""
    if probe_idx.dim() != 2 or probe_idx.shape[0] < 1 or probe_idx.shape[1] < 2:
        raise ValueError(f"probe_idx must be (B, T) token ids with B >= 1 and T >= 2, got {tuple(probe_idx.shape)}")
    R = (probe_idx.shape[1] - 1) // 2
    return _mean_scores(model, probe_idx, {"duplicate_token": lambda w: duplicate_token_score(w, R),
                                           "induction": lambda w: induction_score(w, R)})


def _mean_scores(model, idx: torch.Tensor, scores: dict[str, Callable]) -> dict[str, np.ndarray]:
    """{name: (n_layer, n_head)}: each score of one layer's maps, averaged over idx's rows. Computed a chunk
    of rows at a time: each score is a mean over rows, so the chunks' scores weighted by their sizes."""
    c = model.config
    per_row = 4 * c.n_layer * c.n_head * idx.shape[1] ** 2  # bytes of one sequence's float32 maps, all layers
    rows = max(1, MAPS_BUDGET_BYTES // per_row)
    total = {name: np.zeros((c.n_layer, c.n_head)) for name in scores}
    with eval_mode(model):
        for start in range(0, idx.shape[0], rows):
            chunk = idx[start:start + rows]
            for layer, w in model.attention_maps(chunk).items():
                for name, score in scores.items():
                    total[name][layer] += score(w) * len(chunk)
    return {name: value / idx.shape[0] for name, value in total.items()}
