"""Shared loading for the circuits research: a seed's model at a step, its probe text and role probe."""
import csv
import json
from functools import lru_cache
from pathlib import Path

import numpy as np
import torch

from model import GPT, ModelConfig

ROOT = Path("/work/tmp/circuits")
SEEDS = (1337, 1, 2)


@lru_cache(None)
def config(seed):
    d = json.load(open(ROOT / f"seed{seed}/run/latest/config.json"))["model"]
    d["attn_impl"] = "manual"
    return ModelConfig(**d)


def steps(seed):
    return sorted(int(p.stem.split("_")[1]) for p in (ROOT / f"seed{seed}/weights").glob("step_*.pt"))


def load(seed, step):
    model = GPT(config(seed))
    model.load_state_dict(torch.load(ROOT / f"seed{seed}/weights/step_{step:04d}.pt"))
    return model.eval()


@lru_cache(None)
def probes():
    from data.prepare import prepare_data
    from training.config import load_run_config
    from insight.roles import role_probe
    cfg = load_run_config("configs/induction.yaml", ["wandb.mode=disabled"])
    prepared = prepare_data(cfg.data, block_size=32, quiet=True)
    ids = [int(t) for t in prepared.stream("val").read(0, 32)]
    text = torch.tensor([ids])
    tok = prepared.tokenizer
    probe = role_probe(tok.ordinary_ids(), tok.start_id, 32, batch=8, seed=0)
    # a longer text for the loss: 64 windows of val
    stream = prepared.stream("val")
    long = torch.tensor(np.stack([np.asarray(stream.read(32 * i, 32 * (i + 1)), dtype=np.int64) for i in range(64)]))
    return text, probe, long, tok


def stats(seed):
    """{step: {(layer, head): row dict}} from stats.csv."""
    out = {}
    with open(ROOT / f"seed{seed}/run/attn/stats.csv") as f:
        for r in csv.DictReader(f):
            out.setdefault(int(r["step"]), {})[(int(r["layer"]), int(r["head"]))] = {k: float(v) for k, v in r.items()
                                                                                    if k not in ("step", "layer", "head")}
    return out


def summary(seed):
    return (ROOT / f"seed{seed}/summary.txt").read_text().strip()
