"""The circuit's done-when, checked on runs of `python train.py configs/induction.yaml seed=S out_dir=DIR` as the
monitor left them: for each run, from its attn/stats.csv (what the monitor recorded at every snapshot) and its
latest checkpoint (the final weights):

  (a) the strongest K-composer (k_source) into each formed induction head at the last snapshot is the layer-0
      previous-token head (the layer-0 head with the largest prev_token at the last snapshot);
  (b) path-ablating each layer-0 head from that head's key input: the previous-token head lowers the induction
      score more than any other, and by how much (at least half in at least 2 of 3 runs is the claim);
  (c) the step from which the previous-token head stays the strongest K-composer into each formed head, against
      the summary's phase-change step (within ±50), and the summary's own "formed at".

    PYTHONPATH=. python benchmarks/circuits_research/check_runs.py DIR [DIR ...]   # each a run's out_dir
"""
from __future__ import annotations

import csv
import sys
from pathlib import Path

import torch

from insight.circuits import head_name, path_ablation
from insight.role_plot import head_series, induction_heads, phase_change, _largest
from pretrained.checkpoint import load_checkpoint
from training.attn_monitor import formed_at
from training.config import load_run_config
from data.prepare import prepare_data
from insight.roles import role_probe


def probes(run: Path) -> tuple[torch.Tensor, torch.Tensor]:
    """The monitor's probe text (the first block_size val tokens) and role probe (8 sequences, seed 0)."""
    cfg = load_run_config(str(run / "config.yaml"), ["wandb.mode=disabled"])
    prepared = prepare_data(cfg.data, block_size=cfg.model.block_size, quiet=True)
    text = torch.tensor([[int(t) for t in prepared.stream("val").read(0, cfg.model.block_size)]])
    tok = prepared.tokenizer
    return text, role_probe(tok.ordinary_ids(), tok.start_id, cfg.model.block_size, batch=8, seed=0)


def check(run: Path) -> list[str]:
    with open(run / "attn" / "stats.csv") as f:
        rows = list(csv.DictReader(f))
    last = max(int(r["step"]) for r in rows)
    at_last = {(int(r["layer"]), int(r["head"])): r for r in rows if int(r["step"]) == last}
    steps, series = head_series([(int(r["step"]), int(r["layer"]), int(r["head"]), float(r["induction"])) for r in rows])
    change = phase_change(steps, _largest(series))
    formed = [h[:2] for h in induction_heads(series)]
    layer0 = [key for key in at_last if key[0] == 0]
    pt = max(layer0, key=lambda key: float(at_last[key]["prev_token"]))
    k_rows = [(int(r["step"]), int(r["layer"]), int(r["head"]), r["k_source"]) for r in rows]
    _, model, _ = load_checkpoint(run / "latest")
    text, probe = probes(run)
    lines = [f"{run}: previous-token head {head_name(*pt)} (prev_token {float(at_last[pt]['prev_token']):.2f}), "
             f"phase change at step {change.step if change else None}"]
    for target in formed:
        drops = path_ablation(model, text, probe, "k", target, sorted(layer0))["induction"]
        by_source = dict(zip(sorted(layer0), drops))
        others = min(v for key, v in by_source.items() if key != pt)  # the most negative = the largest drop
        intact = float(at_last[target]["induction"])
        when = formed_at(k_rows, target, head_name(*pt))
        lines.append(
            f"  {head_name(*target)} (induction {intact:.2f}): strongest K source {at_last[target]['k_source']} "
            f"(z {float(at_last[target]['k_z']):.1f}) {'= PT' if at_last[target]['k_source'] == head_name(*pt) else 'NOT PT'}; "
            f"path ablation of PT {by_source[pt]:+.2f} (largest other {others:+.2f}, "
            f"{'PT largest' if by_source[pt] < others else 'PT NOT largest'}, "
            f"{'>= half' if -by_source[pt] >= intact / 2 else '< half'}); PT strongest from step {when} "
            f"({'within ±50' if when is not None and change and abs(when - change.step) <= 50 else 'OUTSIDE ±50'})")
    return lines


if __name__ == "__main__":
    for directory in sys.argv[1:]:
        print("\n".join(check(Path(directory))))
