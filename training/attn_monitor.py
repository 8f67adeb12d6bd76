"""Attention you can watch while it trains.

At every eval (or every `wandb.attn_interval` steps) a fixed probe text goes through the from-scratch
attention path, in eval mode with no grad, and the run records:
  - per layer and head: entropy, sink mass, mean distance and the decay exponent gamma
    (insight/stats.py), as W&B scalars `attn/L{layer}.H{head}/{stat}` and rows of
    `out_dir/attn/stats.csv` (step, layer, head, stats...);
  - a heatmap grid of every head of the configured layers, as `out_dir/attn/layer_{L}/step_{S}.png`
    and a W&B image under `attn/layer_{L}` (one key per layer, so the media panel steps through training);
  - the interactive explorer of every layer and head (insight/explorer/), as
    `out_dir/attn/explorer/step_{S}.html` and a W&B Html under `attn/explorer`.
"""
from __future__ import annotations

import csv
import time
from pathlib import Path

import torch

from data.prepare import PreparedData
from insight.explorer import write_explorer
from insight.heatmap import draw_heatmap
from insight.stats import STAT_NAMES, head_stats
from model.gpt import GPT
from training.config import RunConfig
from training.logger import RunLogger
from training.runtime import Runtime

STATS_FILE = "stats.csv"
EXPLORER_MAX_BYTES = 4_000_000  # per snapshot (a run writes one per eval): q/k/v for the step-by-step view beyond it are left out


def default_layers(n_layer: int) -> list[int]:
    """First, middle and last layer."""
    return sorted({0, n_layer // 2, n_layer - 1})


def probe_ids(cfg: RunConfig, prepared: PreparedData, block_size: int) -> list[int]:
    if cfg.attn.probe_text:
        ids = prepared.tokenizer.encode(cfg.attn.probe_text)
        if not ids:
            raise ValueError("attn.probe_text encodes to no tokens")
        return ids[:block_size]
    return [int(t) for t in prepared.stream("val").read(0, block_size)]


class AttentionMonitor:
    def __init__(self, cfg: RunConfig, model: GPT, prepared: PreparedData, logger: RunLogger, rt: Runtime,
                 start_step: int = 0):
        self.model = model
        self.logger = logger
        self.interval = cfg.wandb.attn_interval
        self.layers_drawn = cfg.attn.layers if cfg.attn.layers is not None else default_layers(model.config.n_layer)
        ids = probe_ids(cfg, prepared, model.config.block_size)
        self.idx = torch.tensor([ids], dtype=torch.long, device=rt.device)  # (1, T)
        self.tokens = prepared.tokenizer.token_strings(ids)
        self.dir = Path(cfg.out_dir) / "attn"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.stats_path = self.dir / STATS_FILE
        self._drop_rows_after(start_step)
        self.seconds = 0.0  # time spent here, to report the overhead

    def _drop_rows_after(self, step: int) -> None:
        """A resumed run redoes the steps after its checkpoint: forget their rows, keep one per (step, layer, head)."""
        if not self.stats_path.is_file():
            return
        with open(self.stats_path, newline="") as f:
            rows = list(csv.reader(f))
        kept = [rows[0]] + [r for r in rows[1:] if r and int(r[0]) <= step]
        if len(kept) != len(rows):
            with open(self.stats_path, "w", newline="") as f:
                csv.writer(f).writerows(kept)

    def due(self, step: int) -> bool:
        return self.interval is not None and step % self.interval == 0

    @torch.no_grad()
    def snapshot(self, step: int) -> None:
        t0 = time.perf_counter()
        # one forward pass gives the maps and what the explorer needs (q, k, v, W_O): from-scratch path, eval
        # mode. One pass also keeps an FSDP run's other processes in step (training/parallel.MonitorFollower)
        internals = self.model.attention_internals(self.idx)
        maps = {layer: found.weights for layer, found in internals.items()}  # {layer: (1, n_head, T, T)}
        scalars: dict[str, object] = {}
        rows = []
        for layer, weights in maps.items():
            stats = head_stats(weights)
            for head in range(weights.shape[1]):
                values = [float(stats[name][head]) for name in STAT_NAMES]
                rows.append([step, layer, head, *values])
                for name, value in zip(STAT_NAMES, values):
                    scalars[f"attn/L{layer}.H{head}/{name}"] = value
        new_file = not self.stats_path.is_file()
        with open(self.stats_path, "a", newline="") as f:
            writer = csv.writer(f)
            if new_file:
                writer.writerow(["step", "layer", "head", *STAT_NAMES])
            writer.writerows(rows)
        images = {}
        for layer in self.layers_drawn:
            png = self.dir / f"layer_{layer}" / f"step_{step:06d}.png"
            png.parent.mkdir(exist_ok=True)
            draw_heatmap(maps[layer][0], self.tokens, title=f"layer {layer}, step {step}", path=png)
            images[f"attn/layer_{layer}"] = png
        explorer = self.write_explorer(step, internals)
        if self.logger.wandb is not None:
            import wandb
            scalars.update({key: wandb.Image(str(png), caption=f"step {step}") for key, png in images.items()})
            scalars["attn/explorer"] = wandb.Html(str(explorer), inject=False)  # inject would add a remote stylesheet
            self.logger.log_wandb(step, scalars)
        self.seconds += time.perf_counter() - t0

    def write_explorer(self, step: int, internals: dict) -> Path:
        """The explorer of every layer and head over the probe, as `attn/explorer/step_{S}.html`."""
        path = self.dir / "explorer" / f"step_{step:06d}.html"
        path.parent.mkdir(exist_ok=True)
        return write_explorer(path, internals, self.tokens, title=f"attention at step {step}", info=f"step {step}",
                              max_bytes=EXPLORER_MAX_BYTES)
