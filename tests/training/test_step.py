"""training/step.py, one optimizer step's worth of work (the micro-batches' gradients averaged, their norm clipped,
the optimizer step): the first step of a real run equals AdamW written out by hand from the same seed's init and
batches. seed, train.batch_size, grad_accum, grad_clip, lr, embedding_lr, beta1, beta2 and weight_decay all shape
it, so each is checked here too (docs/testing.md maps the settings to their tests)."""
from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from data.loader import BatchLoader
from data.shards import SplitFiles
from model import GPT
from tests.helpers import prepared_shakespeare_dir, tiny_config
from training.plan import with_vocab_size
from training.trainer import train

QUIET = ["attn.enabled=false", "wandb.mode=disabled"]


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    return prepared_shakespeare_dir(tmp_path_factory.mktemp("data"))


pytestmark = pytest.mark.usefixtures("data_env")  # conftest.py: ATTNGPT_DATA_DIR -> data_dir, W&B off


@pytest.mark.parametrize("embedding_lr", [None, 3e-2])
def test_the_first_step_equals_a_hand_written_adamw_step(tmp_path, embedding_lr):
    """seed, batch_size, grad_accum, grad_clip, lr, embedding_lr, beta1, beta2 and weight_decay all shape the
    first step: the weights after it equal AdamW written out by hand from the same seed's init and batches,
    the embedding tables at embedding_lr (lr when unset)."""
    cfg = tiny_config(tmp_path / "run", "seed=7", "train.batch_size=3", "train.grad_accum=2", "train.grad_clip=0.05",
                      "train.lr=1e-2", "train.beta1=0.8", "train.beta2=0.9", "train.weight_decay=0.3",
                      "train.warmup_iters=0", "train.max_iters=1", "eval.interval=100", "model.pos=learned", *QUIET,
                      *([f"train.embedding_lr={embedding_lr}"] if embedding_lr else []))
    result = train(cfg)
    from data.prepare import prepare_data
    prepared = prepare_data(cfg.data)
    model_cfg = with_vocab_size(cfg, cfg.model, prepared.tokenizer.vocab_size)
    torch.manual_seed(7)
    model = GPT(model_cfg)  # the run's init: seeded the same way, built first
    loader = BatchLoader(SplitFiles(prepared.split_paths("train"), prepared.dtype), model_cfg.block_size, 3, seed=7)
    for _ in range(2):  # two micro-batches, each loss halved
        x, y = loader.next_batch()
        (model(x, y)[1] / 2).backward()
    grads = {name: p.grad for name, p in model.named_parameters()}
    norm = math.sqrt(sum(float((g ** 2).sum()) for g in grads.values()))
    assert norm > 0.05  # clipping active
    scale = 0.05 / (norm + 1e-6)
    b1, b2, eps = 0.8, 0.9, 1e-8
    tables = {name for name in grads if name.startswith(("tok_emb.", "pos_emb."))}
    assert tables == {"tok_emb.weight", "pos_emb.weight"}  # learned positions, a tied LM head
    for name, p in model.named_parameters():
        lr = (embedding_lr or 1e-2) if name in tables else 1e-2
        g = grads[name] * scale
        m_hat, v_hat = (1 - b1) * g / (1 - b1), (1 - b2) * g * g / (1 - b2)
        decay = 0.3 if p.dim() >= 2 else 0.0
        expected = p.detach() * (1 - lr * decay) - lr * m_hat / (v_hat.sqrt() + eps)
        torch.testing.assert_close(dict(result.model.named_parameters())[name].detach(), expected,
                                   atol=2e-6, rtol=1e-5, msg=name)
