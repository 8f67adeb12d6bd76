"""Eval losses and the in-context-learning score: the same batches of each split at every eval, so evals
compare fairly."""
from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F

from data.loader import BatchLoader
from data.prepare import PreparedData
from insight.icl import icl_score
from model.gpt import GPT
from training.config import RunConfig
from training.runtime import Runtime

EVAL_SEED_OFFSET = 1_000_003  # eval batches come from their own stream, the same at every eval


@torch.no_grad()
def evaluate(model: GPT, cfg: RunConfig, prepared: PreparedData, rt: Runtime, block_size: int) -> dict[str, float]:
    """{"train": loss, "val": loss, "icl_score": val ICL score}: each loss the mean over eval.iters batches of
    its split, the same batches every time (own fixed seed); the ICL score (insight/icl.py: the mean loss
    at the last positions of a window minus the mean around 10% of it) of the val batches' per-position
    losses, averaged over every window (and process)."""
    was_training = model.training
    model.eval()
    batch_size = cfg.eval.batch_size or cfg.train.batch_size
    out = {}
    for split in ("train", "val"):
        loader = BatchLoader(prepared.split_files(split), block_size, batch_size, seed=cfg.seed + EVAL_SEED_OFFSET,
                             rank=rt.rank, world_size=rt.world_size, device=rt.device)
        total = torch.zeros((), device=rt.device)
        per_position = torch.zeros(block_size, device=rt.device)  # (T,) val losses summed over windows
        for _ in range(cfg.eval.iters):
            x, y = loader.next_batch()
            with rt.autocast():
                logits, loss = model(x, y)
            total += loss.float()
            if split == "val":
                losses = F.cross_entropy(logits.float().transpose(1, 2), y, reduction="none")  # (B, T)
                per_position += losses.sum(dim=0)
        if rt.ddp:  # the mean over processes (gloo takes ReduceOp.AVG only from PyTorch 2.6)
            dist.all_reduce(total, op=dist.ReduceOp.SUM)
            total /= rt.world_size
            if split == "val":
                dist.all_reduce(per_position, op=dist.ReduceOp.SUM)
        out[split] = total.item() / cfg.eval.iters
        if split == "val":  # the score is linear in the losses: that of the mean loss at each position
            windows = cfg.eval.iters * x.shape[0] * rt.world_size
            out["icl_score"] = icl_score((per_position / windows)[None])
    model.train(was_training)
    return out
