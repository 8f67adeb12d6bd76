"""GPT.logits: decoding on a CPU multiplies by a cached column-major copy of the LM head; it must give the
head's own numbers, and follow every change to the weight (the cache is keyed by the weight's version)."""
from __future__ import annotations

import torch

from model import GPT, ModelConfig


def model(tie: bool) -> GPT:
    torch.manual_seed(0)
    return GPT(ModelConfig(vocab_size=300, block_size=8, n_layer=1, n_head=2, d_model=16, tie_embeddings=tie)).eval()


def test_column_major_head_equals_the_linear_head():
    for tie in (True, False):
        m = model(tie)
        x = torch.randn(2, 1, 16)
        with torch.no_grad():
            fast = m.logits(x)
        torch.testing.assert_close(fast, m.lm_head(x).detach(), rtol=1e-5, atol=1e-6)
        assert "_head_columns" in m.__dict__  # the fast path ran


def test_cache_follows_in_place_updates_and_skips_training():
    m = model(tie=True)
    x = torch.randn(1, 1, 16)
    with torch.no_grad():
        before = m.logits(x)
        m.tok_emb.weight.mul_(2.0)  # the tied head changes with it: a new version
        after = m.logits(x)
    torch.testing.assert_close(after, 2 * before, rtol=1e-5, atol=1e-6)
    # with grad (training), the head's own Linear runs, so gradients reach the weight
    m.logits(x).sum().backward()
    assert m.lm_head.weight.grad is not None
    # rows beyond the decode threshold take the ordinary path: no copy made for a prefill
    fresh = model(tie=False)
    with torch.no_grad():
        fresh.logits(torch.randn(4, 8, 16))
    assert "_head_columns" not in fresh.__dict__
