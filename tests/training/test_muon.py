"""Muon (training/muon.py): the orthogonalisation against an SVD, fused matrices part by part, one step by hand,
the Newton-Schulz dtype, and the row-sharded path under FSDP2 (2 processes through torchrun)."""
from __future__ import annotations

import math
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from model import GPT
from tests.helpers import REPO, needs_cpu_fsdp, tiny_config
from training.muon import Muon, orthogonalize, orthogonalize_parts
from training.optim import build_optimizers, fused_row_splits


@pytest.mark.parametrize("shape", [(24, 40), (40, 24), (32, 32)])
def test_orthogonalize_keeps_the_singular_vectors_and_evens_the_singular_values(shape):
    """orthogonalize(G) = U f(S) V^T for G = U S V^T, with f(S) in about [0.6, 1.25]: in G's own singular basis
    the result is diagonal, however unequal S was (here spread over 4 orders of magnitude)."""
    gen = torch.Generator().manual_seed(0)
    u, _ = torch.linalg.qr(torch.randn(shape[0], shape[0], generator=gen, dtype=torch.float64))
    v, _ = torch.linalg.qr(torch.randn(shape[1], shape[1], generator=gen, dtype=torch.float64))
    k = min(shape)
    s = torch.logspace(0, -4, k, dtype=torch.float64)[: k // 2].tolist() + [1e-2] * (k - k // 2)
    g = (u[:, :k] * torch.tensor(s, dtype=torch.float64)) @ v[:, :k].T
    o = orthogonalize(g.float()).double()
    in_basis = u[:, :k].T @ o @ v[:, :k]  # (k, k): diagonal when o shares g's singular vectors
    diag = in_basis.diagonal()
    assert (in_basis - torch.diag(diag)).abs().max() < 1e-4
    big = torch.tensor(s) >= 1e-3  # the iteration lifts values above ~1e-3 in 5 steps; smaller ones lag (by design)
    assert diag[big].min() > 0.6 and diag[big].max() < 1.25, diag
    assert o.dtype == torch.float64 and orthogonalize(g.float()).dtype == torch.float32


def test_fused_parts_are_orthogonalised_each_on_its_own():
    """q|k|v rows of very different scales: part by part, every part's singular values land near 1 (times
    sqrt(rows / cols) for a tall part); the whole stack at once would leave the small parts near 0."""
    gen = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(n, 16, generator=gen) * scale for n, scale in ((16, 100.0), (8, 1.0), (24, 0.01)))
    (out,) = orthogonalize_parts([torch.cat([q, k, v])], [(16, 8, 24)], steps=5, dtype=torch.float32)
    for part, rows in zip(out.split([16, 8, 24]), (16, 8, 24)):
        sv = torch.linalg.svdvals(part) / math.sqrt(max(1.0, rows / 16))
        assert sv.min() > 0.6 and sv.max() < 1.25, (rows, sv)
    (whole,) = orthogonalize_parts([torch.cat([q, k, v])], [None], steps=5, dtype=torch.float32)
    assert torch.linalg.svdvals(whole[24:]).max() < 0.1  # v, drowned by q when not split


def test_the_model_declares_its_fused_matrices():
    cfg = tiny_config(Path("unused"), "model.n_head=4", "model.n_kv_head=2", "model.d_model=32", "model.mlp=swiglu",
                      "train.optimizer=muon")
    model = GPT(cfg.model)
    hd, hidden = cfg.model.head_dim, cfg.model.hidden_dim
    assert fused_row_splits("blocks.0.attn.qkv_proj.weight", cfg.model) == (4 * hd, 2 * hd, 2 * hd)
    assert fused_row_splits("blocks.3.mlp.fc_in.weight", cfg.model) == (hidden, hidden)
    assert fused_row_splits("blocks.0.mlp.fc_out.weight", cfg.model) is None
    gelu = tiny_config(Path("unused"), "model.mlp=gelu").model
    assert fused_row_splits("blocks.0.mlp.fc_in.weight", gelu) is None
    muon = build_optimizers(model, cfg.train).optimizers[0]
    rows = {id(p): p.size(0) for p in model.parameters()}
    for group in muon.param_groups:  # every group's splits fit every one of its matrices
        for p in group["params"]:
            assert sum(group["splits"] or (rows[id(p)],)) == rows[id(p)]
    assert sorted(str(g["splits"]) for g in muon.param_groups) == sorted(
        [str((4 * hd, 2 * hd, 2 * hd)), str((hidden, hidden)), "None"])


@pytest.mark.parametrize("nesterov", [True, False])
def test_two_steps_by_hand(nesterov):
    """buf = m buf + (1 - m) g; update = (1 - m) g + m buf (Nesterov) or buf; p = p (1 - lr wd) - lr O(update)
    with O part by part, each scaled by sqrt(max(1, rows/cols))."""
    gen = torch.Generator().manual_seed(2)
    p = torch.nn.Parameter(torch.randn(12, 6, generator=gen))
    grads = [torch.randn(12, 6, generator=gen) for _ in range(2)]
    lr, m, wd, splits = 0.05, 0.8, 0.3, (4, 8)
    opt = Muon([{"params": [p], "splits": splits}], lr=lr, momentum=m, weight_decay=wd, nesterov=nesterov)
    expected, buf = p.detach().clone(), torch.zeros(12, 6)
    for g in grads:
        p.grad = g.clone()
        opt.step()
        buf = m * buf + (1 - m) * g
        update = (1 - m) * g + m * buf if nesterov else buf
        ortho = torch.cat([orthogonalize(update[:4]), orthogonalize(update[4:]) * math.sqrt(8 / 6)])
        expected = expected * (1 - lr * wd) - lr * ortho
    torch.testing.assert_close(p.detach(), expected, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(opt.state[p]["momentum_buffer"], buf, atol=1e-6, rtol=1e-5)


def test_the_iteration_runs_in_the_runs_compute_dtype():
    """set_compute_dtype(bfloat16) puts the iteration in bfloat16 (the step then equals one taken with a
    bfloat16 orthogonalisation, and differs from float32's); float16 and None keep float32."""
    cfg = tiny_config(Path("unused"), "train.optimizer=muon")
    results = {}
    for dtype in (None, torch.bfloat16, torch.float16):
        torch.manual_seed(0)
        model = GPT(cfg.model)
        optimizers = build_optimizers(model, cfg.train)
        optimizers.set_compute_dtype(dtype)
        assert {g["ns_dtype"] for g in optimizers.optimizers[0].param_groups} == {
            torch.bfloat16 if dtype == torch.bfloat16 else torch.float32}
        w = model.blocks[0].mlp.fc_out.weight
        w.grad = torch.ones_like(w).cumsum(0).sin()
        before = w.detach().clone()
        optimizers.optimizers[0].step()
        results[dtype] = (before, w.detach().clone())
    before, after = results[torch.bfloat16]
    lr = cfg.train.muon_lr
    grad = torch.ones_like(before).cumsum(0).sin()
    nesterov = grad.lerp(grad * (1 - cfg.train.muon_momentum), cfg.train.muon_momentum)
    for dtype, ortho_dtype in ((torch.bfloat16, torch.bfloat16), (None, torch.float32)):
        scale = math.sqrt(max(1.0, before.size(0) / before.size(1)))
        expected = before * (1 - lr * cfg.train.weight_decay) - lr * scale * orthogonalize(nesterov, dtype=ortho_dtype)
        torch.testing.assert_close(results[dtype][1], expected, atol=1e-6, rtol=1e-5)
    assert not torch.equal(results[torch.bfloat16][1], results[None][1])
    assert torch.equal(results[torch.float16][1], results[None][1])


def test_a_run_in_bfloat16_orthogonalises_in_bfloat16(tmp_path, monkeypatch):
    """The trainer hands the run's compute dtype to Muon (an explicit dtype here; dtype: auto's choice goes
    the same way, after its measurement): every step's iteration runs in it."""
    import training.muon
    from training.trainer import train
    seen = []
    real = training.muon.orthogonalize_parts
    monkeypatch.setattr(training.muon, "orthogonalize_parts",
                        lambda update, splits, steps, dtype: seen.append(dtype) or real(update, splits, steps, dtype))
    for dtype in ("bfloat16", "float32"):
        seen.clear()
        train(tiny_config(tmp_path / dtype, "train.optimizer=muon", f"dtype={dtype}", "train.max_iters=2",
                          "attn.enabled=false", "wandb.mode=disabled", "train.compile=false"))
        assert seen and set(seen) == {getattr(torch, dtype)}, dtype


SHARDED = textwrap.dedent("""
    import sys, torch, torch.distributed as dist
    sys.path.insert(0, sys.argv[1])
    from training.parallel import fsdp2
    fully_shard = fsdp2().fully_shard
    from model import GPT
    from model.config import ModelConfig
    from training.config import TrainConfig
    from training.optim import build_optimizers
    dist.init_process_group("gloo")
    cfg = ModelConfig(vocab_size=32, block_size=8, n_layer=2, n_head=4, n_kv_head=2, d_model=24, mlp="swiglu",
                      pos="rope", norm="rmsnorm")
    tc = TrainConfig(optimizer="muon", muon_lr=0.05, weight_decay=0.1)
    torch.manual_seed(0)
    plain = GPT(cfg)
    sharded = GPT(cfg)
    sharded.load_state_dict(plain.state_dict())
    for block in sharded.blocks:
        fully_shard(block)
    fully_shard(sharded)
    opts = build_optimizers(plain, tc), build_optimizers(sharded, tc)
    x = torch.randint(0, 32, (2, 8), generator=torch.Generator().manual_seed(1))
    for _ in range(3):
        for model, opt in zip((plain, sharded), opts):
            _, loss = model(x, x)
            loss.backward()
            opt.step()
            opt.zero_grad()
    full = {k: (v.full_tensor() if hasattr(v, "full_tensor") else v) for k, v in sharded.state_dict().items()}
    worst = max((full[k] - v).abs().max().item() for k, v in plain.state_dict().items())
    if dist.get_rank() == 0:
        print("max difference", worst)
    dist.destroy_process_group()
    from common.errors import exit_now
    exit_now(0)  # out of the group: no interpreter finalization (common/errors.py), as train.py under torchrun
""")


@pytest.mark.slow
@needs_cpu_fsdp
def test_row_sharded_matrices_step_as_whole_ones(tmp_path):
    """Under FSDP2 (2 processes, each holding half the rows of every matrix) Muon's steps equal those of one
    process holding the whole model: the gathered update is orthogonalised part by part, as in one process."""
    script = tmp_path / "sharded_muon.py"
    script.write_text(SHARDED)
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                           str(script), str(REPO)], capture_output=True, text=True, timeout=300,
                          env={**__import__("os").environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    worst = float(proc.stdout.split("max difference")[1].split()[0])
    assert worst < 1e-5, proc.stdout
