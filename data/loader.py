"""Random training windows from a split's token shards, reproducible and resumable.

Why this shape: like nanoGPT's get_batch, each batch is `batch_size` windows of `block_size + 1` tokens at
uniformly random offsets of one flat token stream; `x` is a window's first block_size tokens and `y` the same
window shifted by one (the next-token targets). On top of that:
- Shards: the stream is the split's shard files read in order as one (data/shards.py: why a window may
  straddle two); a one-file split gives nanoGPT-style offsets into that file.
- Determinism: the offsets of global batch number g come from a PCG64 generator seeded by (seed, split, g),
  so a seed fixes the whole stream and train and val streams differ.
- DDP: rank r of world_size W draws global batches r, r + W, r + 2W, ...: every rank draws its own
  windows, and W processes with A micro-batches each see exactly the batches one process with W*A
  micro-batches sees in the same step (so their losses agree, tests/training/test_parallel_ddp.py).
- Resumption: the position in the stream is one number, the batches drawn (`state_dict()`, plain JSON);
  `load_state_dict()` continues exactly where the saved run was.
- The memmaps are re-opened for every batch, as nanoGPT does (data/shards.py: TokenStream says why).
- Ids: with `vocab_size` given, every batch is checked to hold only ids below it before it leaves here
  (a max over B*(T+1) ids), so a damaged shard stops the run with one line instead of reaching the
  embedding.

This is the one module of data/ that needs torch (it hands tensors to the training loop).
"""
from __future__ import annotations

import re
import zlib
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import torch

from common.errors import UserError
from data.shards import REPREPARE, Shard, SplitFiles, TokenStream


class BatchLoader:
    """Draws (x, y) int64 batches of shape (batch_size, block_size) from one split's token shards
    (`files`: PreparedData.split_files(split), or SplitFiles(one token file or the shard files, dtype))."""

    def __init__(self, files: SplitFiles, block_size: int, batch_size: int, seed: int, rank: int = 0,
                 world_size: int = 1, device: str | torch.device = "cpu") -> None:
        source = files.source
        self.paths = [Path(source)] if isinstance(source, (str, Path)) else [Path(p) for p in source]
        self.path = self.paths[0] if self.paths else Path()
        self.dtype = np.dtype(files.dtype)
        self.block_size = int(block_size)
        self.batch_size = int(batch_size)
        self.seed, self.rank, self.world_size = int(seed), int(rank), int(world_size)
        # "train" / "val" from train.bin or train_00000.bin
        self.split = files.split if files.split is not None else re.sub(r"_\d+$", "", self.path.stem)
        self.vocab_size = files.vocab_size
        self.device = torch.device(device)
        if self.block_size < 1 or self.batch_size < 1:
            raise UserError(f"block_size and batch_size must be at least 1, got {self.block_size} and {self.batch_size}")
        if self.seed < 0:
            raise UserError(f"seed must be a non-negative integer, got {self.seed}")
        if not 0 <= self.rank < self.world_size:
            raise UserError(f"rank {self.rank} is outside world_size {self.world_size}")
        if not self.paths:
            raise UserError("no token files given: run `python -m data.prepare CONFIG` first")
        shards = []
        for path in self.paths:
            if not path.is_file():
                raise UserError(f"token file '{path}' not found: run `python -m data.prepare CONFIG` first")
            n_bytes = path.stat().st_size
            if n_bytes % self.dtype.itemsize:
                raise UserError(f"token file '{path}' is {n_bytes} bytes, not a whole number of {self.dtype.name} "
                                f"tokens: prepare the data again")
            shards.append(Shard(path, n_bytes // self.dtype.itemsize))
        self.stream = TokenStream(shards, self.dtype)
        self.n_tokens = self.stream.n_tokens
        if self.n_tokens < self.block_size + 1:
            where = f"'{self.path}'" if len(self.paths) == 1 else f"the {len(self.paths)} {self.split} shards"
            raise UserError(f"{where} has {self.n_tokens} tokens, fewer than block_size + 1 = "
                            f"{self.block_size + 1}: lower block_size, or use more data / a larger val_fraction")
        self._split_key = zlib.crc32(self.split.encode("utf-8"))  # stable across runs, unlike hash()
        self.batches_drawn = 0

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        """x, y: (batch_size, block_size) int64 on `device`; y[b, t] is the token after x[b, t]."""
        global_batch = self.batches_drawn * self.world_size + self.rank
        rng = np.random.Generator(np.random.PCG64(
            np.random.SeedSequence(entropy=self.seed, spawn_key=(self._split_key, global_batch))))
        starts = rng.integers(0, self.n_tokens - self.block_size, size=self.batch_size)  # (B,)
        windows = self.stream.windows(starts, self.block_size + 1).astype(np.int64)  # (B, T+1)
        if self.vocab_size is not None and int(windows.max()) >= self.vocab_size:
            raise UserError(f"the {self.split} data holds token id {int(windows.max())}, but the tokenizer has only "
                            f"{self.vocab_size} ids: the prepared folder of '{self.path}' is damaged; {REPREPARE}")
        self.batches_drawn += 1
        x = torch.from_numpy(np.ascontiguousarray(windows[:, :-1]))  # (B, T)
        y = torch.from_numpy(np.ascontiguousarray(windows[:, 1:]))  # (B, T)
        if self.device.type == "cuda":
            return (x.pin_memory().to(self.device, non_blocking=True),
                    y.pin_memory().to(self.device, non_blocking=True))
        return x.to(self.device), y.to(self.device)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        while True:
            yield self.next_batch()

    def state_dict(self) -> dict[str, Any]:
        """Plain-JSON position in the stream: how many batches this rank has drawn."""
        return {"batches_drawn": self.batches_drawn, "seed": self.seed, "rank": self.rank,
                "world_size": self.world_size, "split": self.split}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue the stream a `state_dict()` came from (the same seed, split, rank and world size)."""
        try:
            batches_drawn = int(state["batches_drawn"])
            if batches_drawn < 0:
                raise ValueError("negative batch count")
        except (KeyError, TypeError, ValueError) as e:
            raise UserError(f"batch loader state is not valid ({e}): resume from an intact checkpoint") from None
        saved = (state.get("seed", self.seed), state.get("split", self.split), state.get("rank", self.rank),
                 state.get("world_size", self.world_size))
        if saved != (self.seed, self.split, self.rank, self.world_size):
            raise UserError(f"batch loader state belongs to seed {saved[0]}, split '{saved[1]}', rank {saved[2]} of "
                            f"{saved[3]}, not seed {self.seed}, split '{self.split}', rank {self.rank} of "
                            f"{self.world_size}: resume with the same seed and number of processes")
        self.batches_drawn = batches_drawn
