"""Train configs/induction.yaml for one seed, keeping the weights at init and at every snapshot."""
import sys
from pathlib import Path

import torch

import training.attn_monitor as am
from training.config import load_run_config
from training.trainer import train

seed = int(sys.argv[1])
out = Path(f"/work/tmp/circuits/seed{seed}")
weights = out / "weights"
weights.mkdir(parents=True, exist_ok=True)

orig_init, orig_snapshot = am.AttentionMonitor.__init__, am.AttentionMonitor.snapshot

def init(self, cfg, model, *args, **kwargs):
    orig_init(self, cfg, model, *args, **kwargs)
    torch.save({k: v.detach().clone() for k, v in model.state_dict().items()}, weights / "step_0000.pt")

def snapshot(self, step):
    orig_snapshot(self, step)
    torch.save({k: v.detach().clone() for k, v in self.model.state_dict().items()}, weights / f"step_{step:04d}.pt")

am.AttentionMonitor.__init__, am.AttentionMonitor.snapshot = init, snapshot
cfg = load_run_config("configs/induction.yaml", [f"out_dir={out}/run", f"seed={seed}", "wandb.mode=disabled"])
result = train(cfg)
(out / "summary.txt").write_text(result.induction_summary + "\n")
print(result.induction_summary)
