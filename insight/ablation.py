"""Head ablation: what the next-token loss loses when one head is removed, the causal check on a map.

A map says where a head's weight goes, not whether the model needs what it brings: information also
flows through the values, the residual stream and later layers. Removing the head and measuring the
loss answers that. Head h of layer l writes into the residual stream only through its slice of out_proj's
input, out[:, h] (T, head_dim), which W_O^h = out_proj.weight[:, h * head_dim:(h + 1) * head_dim] reads; it
is removed by replacing that slice:

  zero   by zeros: as if W_O^h's columns were zero (the head writes nothing);
  mean   by its mean over the batch and positions of the intact pass: the head writes its average, so
         what is measured is the loss of what varies with the input, not of a constant offset;
  off    no ablation (the setting that turns it off; ablation_dloss itself refuses it).

ablation_dloss[l, h] = loss(model with head (l, h) removed) - loss(intact model), the mean next-token
cross-entropy over the same positions (nats, float64). Positive = the head helps.

Speed: a head of layer l changes nothing below layer l, so the intact residual stream entering layer l is
computed once (GPT.residual_stream) and each ablation re-runs layers l.. only (GPT.hidden_from), with the
layer's heads ablated side by side in one batch (a HeadPatch per batch row) and the vocab-wide logits
computed in row chunks. benchmarks/ablation_speed.py measures it against re-running the whole model.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import numpy as np
import torch
import torch.nn.functional as F

from insight import ABLATION_MODES
from model.gpt import HeadPatch

LOGIT_ROWS = 512  # rows of vocab-wide logits computed at once (vocab 50257: 100 MB of float32)
ABLATION_BUDGET_BYTES = 1 << 30  # the most one batch of side-by-side ablations may hold (default_heads_per_pass)


@contextmanager
def eval_mode(model: torch.nn.Module) -> Iterator[None]:
    """Eval mode (no dropout) inside, the model's own mode restored afterwards."""
    was_training = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(was_training)


def _targets(idx: torch.Tensor, targets: torch.Tensor | None) -> torch.Tensor:
    """(B, T) targets: as given (-1 = ignored), else idx shifted by one with the last position ignored."""
    if targets is None:
        targets = torch.full_like(idx, -1)
        targets[:, :-1] = idx[:, 1:]
    if targets.shape != idx.shape:
        raise ValueError(f"targets {tuple(targets.shape)} must have idx's shape {tuple(idx.shape)}")
    return targets


def _summed_loss(model, hidden: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Summed cross-entropy (float64 scalar) of final hidden states (N, T, d_model) against targets (N, T),
    -1 ignored: logits only for the counted rows, LOGIT_ROWS at a time."""
    keep = targets.reshape(-1) >= 0
    rows = hidden.reshape(-1, hidden.shape[-1])[keep]  # (n, d_model)
    wanted = targets.reshape(-1)[keep]  # (n,)
    total = torch.zeros((), dtype=torch.float64, device=hidden.device)
    for start in range(0, rows.shape[0], LOGIT_ROWS):
        logits = model.lm_head(rows[start:start + LOGIT_ROWS]).float()  # (chunk, vocab_size)
        total += F.cross_entropy(logits, wanted[start:start + LOGIT_ROWS], reduction="sum").double()
    return total


def _stream_and_head_outputs(model, idx: torch.Tensor, heads: bool) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """GPT.residual_stream(idx) and, if `heads`, every layer's head outputs seen on the way: out_proj's input
    as (B, n_head, T, head_dim)."""
    found: list[torch.Tensor] = []

    def capture(out_proj, args):
        y = args[0]  # (B, T, n_head * head_dim): the heads side by side
        found.append(y.view(*y.shape[:2], model.config.n_head, -1).transpose(1, 2))

    handles = [block.attn.out_proj.register_forward_pre_hook(capture) for block in model.blocks] if heads else []
    try:
        stream = model.residual_stream(idx)
    finally:
        for handle in handles:
            handle.remove()
    return stream, found


def default_heads_per_pass(model, batch: int, T: int) -> int:
    """How many of a layer's heads ablation_dloss removes side by side: all of them, unless one pass would
    hold more than ABLATION_BUDGET_BYTES (a long prompt): its largest tensors per batch copy are the
    from-scratch attention's scores and weights (n_head T x T each) and the MLP's hidden layer."""
    c = model.config
    per_copy = 4 * batch * T * (3 * c.n_head * T + c.hidden_dim + 4 * c.d_model)  # bytes, float32
    return max(1, min(c.n_head, ABLATION_BUDGET_BYTES // per_copy))


@torch.no_grad()
def ablation_dloss(model, idx: torch.Tensor, mode: str = "zero", targets: torch.Tensor | None = None,
                   heads_per_pass: int | None = None) -> np.ndarray:
    """Loss with head (l, h) removed minus the intact loss, (n_layer, n_head) float64 (module doc).

    idx (B, T) token ids; targets (B, T) next tokens (-1 = not counted), by default idx shifted by one.
    mode "zero" or "mean". heads_per_pass: how many of a layer's heads are ablated side by side in one
    batch (default_heads_per_pass: all of them within a memory budget); the result does not depend on it.
    Eval mode (restored afterwards), no gradients."""
    if mode not in ABLATION_MODES or mode == "off":
        raise ValueError(f"ablation mode {mode!r}: ablation_dloss takes 'zero' or 'mean' "
                         f"(ABLATION_MODES' 'off' means not calling it)")
    n_layer, n_head = model.config.n_layer, model.config.n_head
    targets = _targets(idx, targets)
    count = int((targets >= 0).sum())
    if count == 0:
        raise ValueError("no position to score: every target is ignored (-1)")
    B, T = idx.shape
    group = default_heads_per_pass(model, B, T) if heads_per_pass is None else int(heads_per_pass)
    group = max(1, min(group, n_head))
    dloss = np.zeros((n_layer, n_head))
    with eval_mode(model):
        stream, outputs = _stream_and_head_outputs(model, idx, heads=mode == "mean")  # n_layer + 1 (B, T, d_model)
        intact = _summed_loss(model, model.final_norm(stream[-1]), targets)
        means = [out.mean(dim=(0, 2), keepdim=True) for out in outputs] if mode == "mean" else None  # (1, H, 1, hd)
        for layer in range(n_layer):
            attn = model.blocks[layer].attn
            for first in range(0, n_head, group):
                heads = list(range(first, min(first + group, n_head)))
                keep = torch.ones(len(heads), B, n_head, dtype=torch.bool, device=idx.device)
                for row, head in enumerate(heads):
                    keep[row, :, head] = False  # batch copy `row` loses head `head`
                x = stream[layer].repeat(len(heads), 1, 1)  # (len(heads) * B, T, d_model)
                attn.head_patch = HeadPatch(keep.reshape(len(heads) * B, n_head),
                                            None if means is None else means[layer])
                try:
                    hidden = model.hidden_from(layer, x)  # (len(heads) * B, T, d_model)
                finally:
                    attn.head_patch = None
                hidden = hidden.view(len(heads), B, *hidden.shape[1:])
                for row, head in enumerate(heads):
                    dloss[layer, head] = float(_summed_loss(model, hidden[row], targets) - intact) / count
    return dloss


@torch.no_grad()
def token_losses(model, idx: torch.Tensor) -> torch.Tensor:
    """Next-token cross-entropy at every position, (B, T-1) float32: column i is the loss of predicting
    idx[:, i + 1] from idx[:, :i + 1]. Eval mode, no gradients (the ICL score is made from these)."""
    with eval_mode(model):
        logits, _ = model(idx[:, :-1])  # (B, T-1, vocab_size)
    return F.cross_entropy(logits.float().transpose(1, 2), idx[:, 1:], reduction="none")  # (B, T-1)
