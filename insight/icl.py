"""The in-context-learning score: how much lower the loss is late in a sequence than early in it.

Olsson et al. 2022 ("In-context Learning and Induction Heads") take the loss at token 500 minus the loss at
token 50 of 512-token contexts: a model that uses its context predicts better the more it has seen, and the
score falls sharply when induction heads form. Here, for per-position losses of T positions (column i
predicts the next token after a context of i + 1 tokens, as `insight.ablation.token_losses` and a
training loss with reduction="none" give them), with w = max(1, T // 10):

  late   the last w positions:                         columns T - w .. T - 1
  early  w positions centred on 10% of T (token 50 of 512 there): columns c - w // 2 .. c - w // 2 + w - 1,
         c = T // 10, shifted right to start at 0 when T is small
  icl_score = mean loss over late - mean loss over early   (nats; negative = the model uses its context)

Early is not the first positions: with a context of one or two tokens the loss is high for reasons that
have nothing to do with using context, and would swamp the score. The two windows have the same width, so
both means are over the same number of values. For T = 1 both windows are the one position: score 0.
"""
from __future__ import annotations

import torch


def icl_positions(T: int) -> tuple[slice, slice]:
    """(early, late) column slices of per-position losses over T positions (module doc), T >= 1."""
    if T < 1:
        raise ValueError(f"T={T}: the ICL score needs losses at one position at least")
    width = max(1, T // 10)
    start = max(0, T // 10 - width // 2)
    return slice(start, start + width), slice(T - width, T)


def icl_score(token_losses: torch.Tensor) -> float:
    """Mean late loss minus mean early loss (module doc) of token_losses (B, T) or (T,), in nats."""
    losses = torch.as_tensor(token_losses).detach().double()
    if losses.dim() == 1:
        losses = losses[None]
    if losses.dim() != 2:
        raise ValueError(f"token losses must be (B, T) or (T,), got {tuple(losses.shape)}")
    early, late = icl_positions(losses.shape[1])
    return float(losses[:, late].mean() - losses[:, early].mean())
