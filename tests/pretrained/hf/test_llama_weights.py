"""pretrained/hf/llama_weights.py, LlamaForCausalLM names <-> attngpt names. Hugging Face rotates the channel pairs
(i, i + head_dim/2) of each head ("rotate_half"), attngpt the neighbours (2i, 2i+1): with q and k rows permuted
by the mapping, attngpt's rotated q and k give exactly the attention scores of Hugging Face's layout, written out
here from the HF tensors (GQA, biases); v, the SwiGLU MLP's gate | up and everything else keep their rows. The two
row orders are inverse permutations, the names and shapes are transformers' own, the round trip is bit-equal."""
from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F

from model import GPT, ModelConfig
from pretrained.hf.llama_weights import from_hf, hf_rows_to_ours, ours_rows_to_hf, to_hf
from tests.hf_models import transformers_or_skip

CONFIG = ModelConfig(vocab_size=40, block_size=16, n_layer=2, n_head=4, n_kv_head=2, d_model=32, pos="rope",
                     norm="rmsnorm", mlp="swiglu", bias=True, tie_embeddings=False, rope_theta=500.0)
T = 12


def random_hf_state(config: ModelConfig, seed: int = 0) -> dict[str, torch.Tensor]:
    """Random tensors under the HF names and shapes of `config` (attngpt's own init would leave biases at 0)."""
    g = torch.Generator().manual_seed(seed)
    return {name: torch.randn(t.shape, generator=g) * 0.5 for name, t in to_hf(GPT(config).state_dict(), config).items()}


def rotate_half_rope(x: torch.Tensor, theta: float) -> torch.Tensor:
    """Hugging Face's Llama RoPE on x (B, heads, T, head_dim), written out: x cos + rotate_half(x) sin, the angles
    of pair j (channels j and j + head_dim/2) being pos * theta^(-2j/head_dim)."""
    head_dim = x.shape[-1]
    inv_freq = theta ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    angles = torch.outer(torch.arange(x.shape[-2], dtype=torch.float64), inv_freq)
    cos, sin = torch.cat([angles.cos()] * 2, dim=-1).float(), torch.cat([angles.sin()] * 2, dim=-1).float()
    x1, x2 = x[..., :head_dim // 2], x[..., head_dim // 2:]
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin


@pytest.mark.parametrize("head_dim", [2, 8, 64])
def test_the_two_row_orders_are_inverse_permutations(head_dim):
    ours, theirs = hf_rows_to_ours(head_dim), ours_rows_to_hf(head_dim)
    assert sorted(ours.tolist()) == list(range(head_dim))
    assert torch.equal(ours[theirs], torch.arange(head_dim)) and torch.equal(theirs[ours], torch.arange(head_dim))
    assert ours[:4].tolist() == [0, head_dim // 2, 1, head_dim // 2 + 1][:min(4, head_dim)]


def test_attngpts_rotated_q_and_k_give_hugging_faces_attention_scores():
    hf = random_hf_state(CONFIG)
    model = GPT(CONFIG).eval()
    model.load_state_dict(from_hf(hf, CONFIG))
    x = torch.randn(1, T, CONFIG.d_model, generator=torch.Generator().manual_seed(1))
    n_rep, D = CONFIG.n_head // CONFIG.n_kv_head, CONFIG.head_dim
    for i, block in enumerate(model.blocks):
        p = f"model.layers.{i}."

        def heads(name: str, n: int) -> torch.Tensor:
            return (x @ hf[f"{p}self_attn.{name}.weight"].T + hf[f"{p}self_attn.{name}.bias"]).view(1, T, n, D
                                                                                                    ).transpose(1, 2)

        q_hf = rotate_half_rope(heads("q_proj", CONFIG.n_head), CONFIG.rope_theta)
        k_hf = rotate_half_rope(heads("k_proj", CONFIG.n_kv_head), CONFIG.rope_theta)
        with torch.no_grad():
            q, k, v = block.attn.project_qkv(x, model._rope(T))
            torch.testing.assert_close(q @ k.repeat_interleave(n_rep, 1).transpose(-1, -2),
                                       q_hf @ k_hf.repeat_interleave(n_rep, 1).transpose(-1, -2), atol=1e-4, rtol=1e-4)
            torch.testing.assert_close(v, heads("v_proj", CONFIG.n_kv_head))
            mlp = F.linear(F.silu(F.linear(x, hf[f"{p}mlp.gate_proj.weight"], hf[f"{p}mlp.gate_proj.bias"]))
                           * F.linear(x, hf[f"{p}mlp.up_proj.weight"], hf[f"{p}mlp.up_proj.bias"]),
                           hf[f"{p}mlp.down_proj.weight"], hf[f"{p}mlp.down_proj.bias"])
            torch.testing.assert_close(block.mlp(x), mlp)
            torch.testing.assert_close(block.attn.out_proj.weight, hf[f"{p}self_attn.o_proj.weight"], atol=0, rtol=0)
            torch.testing.assert_close(block.attn_norm.weight, hf[f"{p}input_layernorm.weight"], atol=0, rtol=0)
            torch.testing.assert_close(block.mlp_norm.weight, hf[f"{p}post_attention_layernorm.weight"], atol=0, rtol=0)
    assert float(q.std()) > 0.1  # random weights: the scores above could not agree by accident


def test_the_names_and_shapes_are_those_of_transformers_llama():
    transformers = transformers_or_skip()
    hf_model = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=40, hidden_size=32, intermediate_size=CONFIG.hidden_dim, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=16, attention_bias=True, mlp_bias=True,
        tie_word_embeddings=False))
    theirs = {name: tuple(t.shape) for name, t in hf_model.state_dict().items()}
    ours = {name: tuple(t.shape) for name, t in random_hf_state(CONFIG).items()}
    assert ours == {name: shape for name, shape in theirs.items() if not name.endswith("rotary_emb.inv_freq")}


@pytest.mark.parametrize("change", [{}, {"tie_embeddings": True}, {"bias": False, "n_kv_head": 1}])
def test_the_round_trip_is_bit_equal(change):
    config = dataclasses.replace(CONFIG, **change)
    hf = random_hf_state(config, seed=2)
    ours = from_hf(hf, config)
    back = to_hf(ours, config)
    assert back.keys() == hf.keys()
    for name, tensor in hf.items():
        assert torch.equal(back[name], tensor), name
    assert ("lm_head.weight" in ours) is not config.tie_embeddings
