"""Eval losses: the same batches of each split at every eval, so evals compare fairly."""
from __future__ import annotations

import torch
import torch.distributed as dist

from data.loader import BatchLoader
from data.prepare import PreparedData
from model.gpt import GPT
from training.config import RunConfig
from training.runtime import Runtime

EVAL_SEED_OFFSET = 1_000_003  # eval batches come from their own stream, the same at every eval


@torch.no_grad()
def evaluate(model: GPT, cfg: RunConfig, prepared: PreparedData, rt: Runtime, block_size: int) -> dict[str, float]:
    """Mean loss over eval.iters batches of each split; the same batches every time (own fixed seed)."""
    was_training = model.training
    model.eval()
    batch_size = cfg.eval.batch_size or cfg.train.batch_size
    out = {}
    for split in ("train", "val"):
        loader = BatchLoader(prepared.split_paths(split), prepared.dtype, block_size, batch_size,
                             seed=cfg.seed + EVAL_SEED_OFFSET, rank=rt.rank, world_size=rt.world_size,
                             device=rt.device, split=split, vocab_size=prepared.tokenizer.vocab_size)
        total = torch.zeros((), device=rt.device)
        for _ in range(cfg.eval.iters):
            x, y = loader.next_batch()
            with rt.autocast():
                _, loss = model(x, y)
            total += loss.float()
        if rt.ddp:  # the mean over processes (gloo takes ReduceOp.AVG only from PyTorch 2.6)
            dist.all_reduce(total, op=dist.ReduceOp.SUM)
            total /= rt.world_size
        out[split] = total.item() / cfg.eval.iters
    model.train(was_training)
    return out
