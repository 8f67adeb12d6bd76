"""configs/gpt2-124m.yaml end to end, CI-sized: the path 8 GPUs take, on 2 CPU processes (gloo).

The corpus is a local stand-in for FineWeb-Edu laid out as its hub repository is: a README.md whose
`configs:` map `sample-10BT` to `sample/10BT/*.parquet` files. Only `data.name` points elsewhere; every
other data setting is the config's own (config_name, split, text_column, streaming, tokenizer gpt2,
val_fraction 0.0005). The model, batch and step count are shrunk by overrides. The runs go through
torchrun, once with DDP and once with FSDP: streamed preparation in parallel workers (one part per
file), token shards, the loader across shards, checkpoints, and a consolidated model to sample from.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from pretrained.checkpoint import load_model
from tests.helpers import REPO, needs_cpu_fsdp, run_cli

FILES, DOCS = 3, 800  # 2,400 documents: val_fraction 0.0005 puts exactly one (document 1999) in val
SHRINK = ["device=cpu", "dtype=float32", "model.n_layer=2", "model.n_head=2", "model.n_kv_head=2", "model.d_model=64",
          "model.block_size=32", "train.batch_size=2", "train.grad_accum=1", "train.max_iters=4", "train.warmup_iters=2",
          "train.compile=false", "train.log_interval=1", "train.peak_flops=1e12", "eval.interval=2", "eval.iters=2",
          "attn.layers=[0,1]", "wandb.mode=disabled", "data.num_proc=2"]
TORCHRUN = ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "train.py",
            str(REPO / "configs" / "gpt2-124m.yaml")]


@pytest.fixture(scope="module")
def hub_like(tmp_path_factory) -> dict[str, str]:
    import datasets

    repo = tmp_path_factory.mktemp("fineweb-edu")
    (repo / "README.md").write_text("---\nconfigs:\n- config_name: sample-10BT\n  data_files:\n  - split: train\n"
                                    "    path: sample/10BT/*\n---\n# a local stand-in\n", encoding="utf-8")
    (repo / "sample" / "10BT").mkdir(parents=True)
    for f in range(FILES):
        texts = [f"Lesson {f}.{j}: plants turn light into chemical energy, and animals eat the plants. " * 3
                 for j in range(DOCS)]
        datasets.Dataset.from_dict({"text": texts, "id": [f"{f}-{j}" for j in range(DOCS)], "score": [3.1] * DOCS}
                                   ).to_parquet(str(repo / "sample" / "10BT" / f"{f:03d}_00000.parquet"))
    return {"repo": str(repo), "ATTNGPT_DATA_DIR": str(tmp_path_factory.mktemp("data")), "OMP_NUM_THREADS": "1"}


def run(hub_like: dict[str, str], out_dir: Path, *extra: str):
    env = {k: v for k, v in hub_like.items() if k != "repo"}
    proc = run_cli([*TORCHRUN, f"data.name={hub_like['repo']}", *SHRINK, f"out_dir={out_dir}", *extra],
                   env_extra=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def val_losses(out_dir: Path) -> list[float]:
    rows = [json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines()]
    return [row["val/loss"] for row in rows if "val/loss" in row]


@pytest.mark.slow
@pytest.mark.parametrize("parallel", ["ddp", pytest.param("fsdp", marks=needs_cpu_fsdp)])
def test_gpt2_124m_recipe_dry_run(hub_like, tmp_path, parallel):
    out = tmp_path / parallel
    proc = run(hub_like, out, f"train.parallel={parallel}", *(["attn.enabled=false"] if parallel == "ddp" else []))
    assert "2 processes" in proc.stderr and ("FSDP" in proc.stderr) == (parallel == "fsdp")
    [folder] = [p for p in (Path(hub_like["ATTNGPT_DATA_DIR"]) / "prepared").iterdir() if p.is_dir()]
    meta = json.loads((folder / "meta.json").read_text())
    assert meta["parts"] == FILES and meta["documents"] == {"train": FILES * DOCS - 1, "val": 1}
    assert [e["file"] for e in meta["shards"]["train"]] == [f"train_{i:05d}.bin" for i in range(FILES)]
    assert [e["file"] for e in meta["shards"]["val"]] == ["val_00002.bin"]  # document 1999 is in file 2
    assert meta["tokenizer"]["encoding"] == "gpt2" and meta["config"]["streaming"] is True
    losses = val_losses(out)
    assert len(losses) == 2 and losses[1] < losses[0] < 11.0  # ln(50304) = 10.8 at the start, and falling
    model, payload = load_model(out / "best")  # consolidated, whatever the parallelism
    assert model.config.vocab_size == 50304 and model.config.n_layer == 2
    assert payload["tokenizer"] == {"kind": "tiktoken", "encoding": "gpt2", "vocab_size": 50257}
    assert (out / "latest" / ("dcp" if parallel == "fsdp" else "train_state.pt")).exists()
