"""Training end to end on tiny.yaml: the loss falls, checkpoints reload, a resumed run is exact,
W&B offline holds the scalars, and bad configs get one clear line."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from common.config_io import apply_overrides
from common.errors import UserError
from pretrained.checkpoint import load_model
from tests.helpers import TINY, assert_one_line_error, run_cli, shakespeare_data_dir
from training.checkpoint import load_train_state
from training.config import load_run_config
from training.optim import lr_factor
from training.trainer import train


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    return shakespeare_data_dir(tmp_path_factory.mktemp("data"))


pytestmark = pytest.mark.usefixtures("data_env")  # conftest.py: ATTNGPT_DATA_DIR -> data_dir, W&B off


def tiny(out_dir: Path, *overrides: str):
    return load_run_config(TINY, [f"out_dir={out_dir}", *overrides])


def test_tiny_trains_loss_falls_and_checkpoints_reload(tmp_path):
    result = train(tiny(tmp_path, "train.max_iters=40", "attn.enabled=false"))
    assert result.step == 40 and len(result.losses) == 40
    first, last = sum(result.losses[s] for s in range(3)) / 3, sum(result.losses[s] for s in range(37, 40)) / 3
    assert last < first - 0.5, (first, last)
    assert [e["step"] for e in result.evals] == [20, 40]
    for name in ("model.safetensors", "config.json", "train_state.pt"):
        assert (tmp_path / "latest" / name).is_file()
    assert (tmp_path / "best" / "model.safetensors").is_file() and (tmp_path / "config.yaml").is_file()
    # the checkpoint reloads into an identical model
    reloaded, payload = load_model(tmp_path / "latest")
    idx = torch.randint(0, reloaded.config.vocab_size, (2, 32))
    result.model.eval()
    assert torch.equal(reloaded(idx)[0], result.model(idx)[0])
    assert payload["tokenizer"]["kind"] == "char" and reloaded.config.vocab_size == 65
    state = load_train_state(tmp_path / "latest")
    assert state["step"] == 40 and state["loader"]["batches_drawn"] == 40
    assert state["best_val"] == min(e["val"] for e in result.evals)
    logged = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert any("val/loss" in row for row in logged) and any("train/loss" in row for row in logged)


def test_resume_reproduces_the_uninterrupted_run_exactly(tmp_path):
    # dropout on, so the torch RNG state must be restored too; grad accumulation on
    overrides = ["train.max_iters=12", "eval.interval=4", "model.dropout=0.1", "train.grad_accum=2",
                 "attn.enabled=false"]
    straight = train(tiny(tmp_path / "a", *overrides))
    first = train(tiny(tmp_path / "b", *overrides), should_stop=lambda step: step == 6)
    assert first.interrupted == "requested" and sorted(first.losses) == list(range(6))
    second = train(tiny(tmp_path / "b", *overrides))
    assert sorted(second.losses) == list(range(6, 12))
    assert {**first.losses, **second.losses} == straight.losses  # exact float equality on CPU
    for (name, a), (_, b) in zip(straight.model.state_dict().items(), second.model.state_dict().items()):
        assert torch.equal(a, b), name


def test_muon_optimizer_trains(tmp_path):
    result = train(tiny(tmp_path, "train.max_iters=30", "train.optimizer=muon", "attn.enabled=false"))
    assert result.losses[29] < result.losses[0] - 0.5


def test_adamw_is_fused_on_cpu_and_steps_like_textbook_adamw():
    """build_optimizers picks the fused kernel on a CPU; its updates equal torch's single-tensor AdamW
    (the for-loop reference implementation) with the same groups: decay on 2-D weights only."""
    from model import GPT
    from training.optim import build_optimizers
    cfg = tiny(Path("unused"), "train.lr=1e-2", "train.weight_decay=0.1")
    torch.manual_seed(0)
    model = GPT(cfg.model)
    twin = GPT(cfg.model)
    twin.load_state_dict(model.state_dict())
    initial = {name: p.detach().clone() for name, p in model.named_parameters()}
    (opt,) = build_optimizers(model, cfg.train).optimizers
    assert opt.defaults["fused"] is True
    decay = [p for p in twin.parameters() if p.dim() >= 2]
    no_decay = [p for p in twin.parameters() if p.dim() < 2]
    reference = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                                  lr=1e-2, betas=(cfg.train.beta1, cfg.train.beta2), foreach=False)
    idx = torch.randint(0, cfg.model.vocab_size, (2, 16), generator=torch.Generator().manual_seed(1))
    for _ in range(3):
        for m, o in ((model, opt), (twin, reference)):
            o.zero_grad()
            m(idx, targets=idx)[1].backward()
            o.step()
    for (name, a), b in zip(model.named_parameters(), twin.parameters()):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5, msg=name)
        assert not torch.equal(a, initial[name]), f"{name} did not move: the comparison would prove little"


def test_lr_schedule_warms_up_from_nonzero_and_decays_to_min():
    cfg = tiny(Path("unused"), "train.lr=1e-3", "train.min_lr=1e-4", "train.warmup_iters=10",
               "train.max_iters=100").train
    factors = [lr_factor(step, cfg) for step in range(120)]
    assert factors[0] == pytest.approx(0.1) and factors[9] == pytest.approx(1.0)
    assert all(a <= b for a, b in zip(factors[:10], factors[1:10]))  # warmup rises
    assert all(a >= b for a, b in zip(factors[10:100], factors[11:100]))  # cosine falls
    assert factors[100] == factors[119] == pytest.approx(0.1)


def test_overrides_are_typed_and_nested():
    raw = apply_overrides({"train": {"lr": 1.0}}, ["train.lr=3e-4", "model.n_layer=3", "attn.layers=[0, 2]",
                                                   "wandb.run_name=abc", "train.min_lr=null"])
    # YAML 1.1 reads 3e-4 (no dot) as a string; the dataclass type check turns it into a float below
    assert raw == {"train": {"lr": "3e-4", "min_lr": None}, "model": {"n_layer": 3}, "attn": {"layers": [0, 2]},
                   "wandb": {"run_name": "abc"}}
    cfg = load_run_config(TINY, ["train.lr=3e-4", "model.n_layer=3", "attn.layers=[0,2]"])
    assert cfg.train.lr == 3e-4 and isinstance(cfg.train.lr, float) and cfg.model.n_layer == 3


@pytest.mark.parametrize("overrides, fragments", [
    (["train.lrr=1"], ["unknown config key 'train.lrr'", "did you mean 'train.lr'"]),
    (["modle.n_layer=2"], ["unknown config key 'modle'", "did you mean 'model'"]),
    (["train.max_iters=ten"], ["'train.max_iters' got 'ten'", "expected an integer"]),
    (["train.lr=0"], ["lr=0.0", "must be > 0"]),
    (["train.batch_size=0"], ["batch_size=0", "must be >= 1"]),
    (["train.grad_accum=0"], ["grad_accum=0", "must be >= 1"]),
    (["model.block_size=0"], ["block_size=0", "positive integer"]),
    (["eval.iters=0"], ["iters=0", ">= 1"]),
    (["model.n_kv_head=3"], ["n_kv_head=3"]),
    (["model.norm=batchnorm"], ["'model.norm' got 'batchnorm'", "layernorm"]),
    (["train.compile=maybe"], ["expected true, false or 'auto'"]),
    (["train.lr"], ["must look like section.key=value"]),
])
def test_bad_config_values_raise_one_clear_user_error(overrides, fragments):
    with pytest.raises(UserError) as e:
        load_run_config(TINY, overrides)
    message = str(e.value)
    assert "\n" not in message
    for fragment in fragments:
        assert fragment in message, message


def test_nonfinite_loss_stops_and_keeps_the_last_good_checkpoint(tmp_path, monkeypatch):
    cfg = tiny(tmp_path / "stop", "train.max_iters=8", "eval.interval=4", "attn.enabled=false")
    from model.gpt import GPT
    real_forward = GPT.forward
    calls = {"n": 0}

    def poisoned(self, idx, targets=None, input_pos=None):
        logits, loss = real_forward(self, idx, targets, input_pos)
        if self.training and loss is not None:
            calls["n"] += 1
            if calls["n"] == 6:  # step 5 (0-based): after the checkpoint at step 4
                loss = loss * float("nan")
        return logits, loss

    monkeypatch.setattr(GPT, "forward", poisoned)
    with pytest.raises(UserError, match="step 5: the loss or gradient norm is not finite"):
        train(cfg)
    monkeypatch.setattr(GPT, "forward", real_forward)
    model, _ = load_model(tmp_path / "stop" / "latest")  # still loads: finite weights from step 4
    assert load_train_state(tmp_path / "stop" / "latest")["step"] == 4
    assert all(torch.isfinite(p).all() for p in model.parameters())

    calls["n"] = 0
    monkeypatch.setattr(GPT, "forward", poisoned)
    result = train(tiny(tmp_path / "skip", "train.max_iters=8", "eval.interval=4", "attn.enabled=false",
                        "train.nonfinite=skip"))
    assert result.skipped_steps == 1 and 5 not in result.losses and result.step == 8
    assert all(math.isfinite(v) for v in result.losses.values())


def test_offline_wandb_run_holds_the_scalars(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    train(tiny(tmp_path, "train.max_iters=20", "wandb.mode=offline"))
    # run.finish() only *informs* the wandb service, which closes the run's transaction log on its own
    # time; under load the .wandb file can still hold just its header here. Tearing the service down
    # waits for it to exit, which flushes every log (the CLI gets the same from wandb's atexit hook).
    import wandb
    wandb.teardown()
    runs = list((tmp_path / "wandb").glob("offline-run-*"))
    assert len(runs) == 1
    records = next(runs[0].glob("run-*.wandb")).read_bytes()
    for key in (b"train/loss", b"val/loss", b"lr", b"tokens_per_s", b"mfu", b"grad_norm"):
        assert key in records, key
    # attention while it trains: one heatmap per drawn layer (tiny: 2 layers -> 0 and 1) per snapshot
    # (evals at steps 20), and the per-head statistic keys
    images = sorted(p.name for p in (runs[0] / "files" / "media" / "images").rglob("*.png"))
    assert len(images) == 4 and any("layer_0" in n for n in images) and any("layer_1" in n for n in images)
    assert any("heads_over_training" in n for n in images) and any("circuit_picture" in n for n in images)
    pages = list((runs[0] / "files" / "media" / "html").rglob("*.html"))  # the explorer, as wandb.Html
    assert len(pages) == 1 and b"attn/explorer" in records
    assert "wandb.ai" not in pages[0].read_text(encoding="utf-8")  # no stylesheet injected: still offline
    for stat in ("entropy", "sink_mass", "mean_distance", "decay_gamma", "decay_r2"):
        for layer in (0, 1):
            for head in range(4):
                assert f"attn/L{layer}.H{head}/{stat}".encode() in records


def test_attention_snapshots_on_disk(tmp_path):
    result = train(tiny(tmp_path, "train.max_iters=20", "eval.interval=10", "wandb.attn_interval=5",
                        "model.n_layer=3", "attn.layers=[2]"))
    assert result.attn_seconds > 0
    rows = (tmp_path / "attn" / "stats.csv").read_text().splitlines()
    assert rows[0] == ("step,layer,head,entropy,sink_mass,mean_distance,decay_gamma,decay_r2,prev_token,"
                       "duplicate_token,induction,ablation_dloss,q_source,q_z,k_source,k_z,v_source,v_z")
    keys = [tuple(map(int, row.split(",")[:3])) for row in rows[1:]]
    # snapshots at every eval (10, 20) and every attn_interval (5, 15): one row per (step, layer, head)
    expected = [(step, layer, head) for step in (5, 10, 15, 20) for layer in range(3) for head in range(4)]
    assert keys == expected
    for row in rows[1:]:
        entropy, sink, distance = map(float, row.split(",")[3:6])
        assert 0 <= entropy <= 1 + 1e-5 and 0 <= sink <= 1 and 0 <= distance <= 31
    pngs = sorted(p.name for p in (tmp_path / "attn" / "layer_2").glob("*.png"))
    assert pngs == [f"step_{s:06d}.png" for s in (5, 10, 15, 20)]
    assert not (tmp_path / "attn" / "layer_0").exists()
    pages = sorted(p.name for p in (tmp_path / "attn" / "explorer").glob("*.html"))  # every layer, every snapshot
    assert pages == [f"step_{s:06d}.html" for s in (5, 10, 15, 20)]
    page = (tmp_path / "attn" / "explorer" / "step_000020.html").read_text(encoding="utf-8")
    assert '"layers": [0, 1, 2]' in page and '"info": "step 20"' in page


# --- the real command line -----------------------------------------------------------------------

def test_cli_trains_and_reports(tmp_path, data_dir):
    proc = run_cli(["train.py", "configs/tiny.yaml", f"out_dir={tmp_path}", "train.max_iters=10",
                    "eval.interval=5"], env_extra={"ATTNGPT_DATA_DIR": str(data_dir)})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "max_iters: 10" in proc.stdout and "done: 10 steps in " in proc.stdout  # resolved config printed
    assert "step 10: train loss" in proc.stderr
    saved = (tmp_path / "config.yaml").read_text()
    assert "max_iters: 10" in saved


@pytest.mark.parametrize("args, fragments", [
    (["configs/missing.yaml"], ["config file 'configs/missing.yaml' not found"]),
    (["configs/tiny.yaml", "train.lrr=1"], ["did you mean 'train.lr'"]),
    (["configs/tiny.yaml", "device=cuda"], ["no usable CUDA GPU", "device=cpu"]),
])
def test_cli_bad_input_one_line_exit_2(tmp_path, data_dir, args, fragments):
    if "device=cuda" in args and torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    proc = run_cli(["train.py", *args, f"out_dir={tmp_path}"], env_extra={"ATTNGPT_DATA_DIR": str(data_dir)})
    assert_one_line_error(proc, "train.py", *fragments)


def test_cli_invalid_yaml_and_other_shape(tmp_path, data_dir):
    bad = tmp_path / "bad.yaml"
    bad.write_text("model:\n  n_layer: [1\n")
    proc = run_cli(["train.py", str(bad)])
    assert_one_line_error(proc, "train.py", "is not valid YAML", "line")
    out = tmp_path / "run"
    assert train(tiny(out, "train.max_iters=2", "attn.enabled=false")).step == 2
    proc = run_cli(["train.py", "configs/tiny.yaml", f"out_dir={out}", "model.n_layer=3"],
                   env_extra={"ATTNGPT_DATA_DIR": str(data_dir)})
    assert_one_line_error(proc, "train.py", "different model", "n_layer 2 vs 3")
