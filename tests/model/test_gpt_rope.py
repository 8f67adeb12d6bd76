"""RoPE: the eager (complex) and compiled (real) rotations agree, and the rotation has RoPE's properties."""
from __future__ import annotations

import math

import torch

from model import GPT, ModelConfig
from model.gpt import apply_rope, rope_frequencies, rotate_complex, rotate_real


def test_real_and_complex_rotations_are_equal():
    gen = torch.Generator().manual_seed(0)
    pairs = torch.randn(2, 7, 3, 8, 2, generator=gen)  # (B, T, heads, head_dim/2, 2)
    freqs = rope_frequencies(16, 7, theta=500.0)
    torch.testing.assert_close(rotate_real(pairs, freqs), rotate_complex(pairs, freqs), rtol=0, atol=1e-6)


def test_table_holds_cos_and_sin_of_the_angles():
    freqs = rope_frequencies(head_dim=4, max_len=3, theta=100.0)  # angle(pos, j) = pos * 100^(-2j/4)
    assert freqs.shape == (3, 2, 2) and freqs.dtype == torch.float32
    for pos in range(3):
        for j, inv in enumerate((1.0, 0.1)):
            assert math.isclose(freqs[pos, j, 0].item(), math.cos(pos * inv), abs_tol=1e-7)
            assert math.isclose(freqs[pos, j, 1].item(), math.sin(pos * inv), abs_tol=1e-7)


def test_scores_depend_only_on_relative_position():
    gen = torch.Generator().manual_seed(1)
    q, k = torch.randn(1, 1, 1, 8, generator=gen), torch.randn(1, 1, 1, 8, generator=gen)
    freqs = rope_frequencies(8, 40)

    def score(m: int, n: int) -> float:
        return (apply_rope(q, freqs[m:m + 1]) * apply_rope(k, freqs[n:n + 1])).sum().item()
    assert math.isclose(score(5, 2), score(30, 27), rel_tol=1e-5)
    assert math.isclose(score(9, 9), (q * k).sum().item(), rel_tol=1e-5)  # distance 0: no rotation left
    assert not math.isclose(score(5, 2), score(5, 3), rel_tol=1e-3)


def test_table_stays_float32_when_the_model_is_cast():
    model = GPT(ModelConfig(vocab_size=11, block_size=16, n_layer=1, n_head=2, d_model=8, pos="rope"))
    before = model.rope_freqs.clone()
    model = model.to(torch.bfloat16)
    assert model.rope_freqs.dtype == torch.float32
    torch.testing.assert_close(model.rope_freqs, before, rtol=0, atol=0)
