"""Llama-family weights: Hugging Face LlamaForCausalLM / MistralForCausalLM names <-> attngpt names.

Three differences besides the names:
- RoPE pairing. attngpt rotates interleaved channel pairs (2i, 2i+1) of each head (a complex multiply,
  Meta's reference layout); HF rotates (i, i + head_dim/2) ("rotate_half"). The same network therefore
  has its q and k projection rows permuted within every head: HF row i is attngpt row 2i, HF row
  head_dim/2 + i is attngpt row 2i+1. v, o and everything else are untouched.
- q, k, v live in one attngpt matrix (rows: n_head q heads, n_kv_head k heads, n_kv_head v heads).
- SwiGLU's gate and up projections live in one attngpt matrix fc_in, rows [gate; up].
"""
from __future__ import annotations

import re

import torch

from model.config import ModelConfig

LAYER_NAME = re.compile(r"model\.layers\.(\d+)\.")  # the tensors of layer i: model.layers.i.*
NORMS = [("input_layernorm", "attn_norm"), ("post_attention_layernorm", "mlp_norm")]


def is_buffer(name: str) -> bool:
    """RoPE tables that older Llama checkpoints saved beside the weights."""
    return name.endswith(".rotary_emb.inv_freq")


def normalize_name(name: str) -> str:
    return name


def hf_rows_to_ours(head_dim: int) -> torch.Tensor:
    """Index that reorders one head's HF rows into attngpt's: ours = theirs[index] = [0, d/2, 1, d/2+1, ...]."""
    half = head_dim // 2
    return torch.stack([torch.arange(half), torch.arange(half) + half], dim=1).flatten()


def ours_rows_to_hf(head_dim: int) -> torch.Tensor:
    """The inverse: theirs = ours[index] = [0, 2, 4, ..., 1, 3, 5, ...]."""
    return torch.cat([torch.arange(0, head_dim, 2), torch.arange(1, head_dim, 2)])


def permute_heads(w: torch.Tensor, n_heads: int, index: torch.Tensor) -> torch.Tensor:
    """Reorder the rows of each head of w (n_heads * head_dim, ...) by `index` (a permutation of head_dim)."""
    head_dim = w.shape[0] // n_heads
    return w.reshape(n_heads, head_dim, *w.shape[1:])[:, index.to(w.device)].reshape(w.shape)


def from_hf(hf: dict[str, torch.Tensor], config: ModelConfig) -> dict[str, torch.Tensor]:
    """HF state -> attngpt state (names of GPT.state_dict; a tied head left out)."""
    index = hf_rows_to_ours(config.head_dim)
    out = {"tok_emb.weight": hf["model.embed_tokens.weight"], "final_norm.weight": hf["model.norm.weight"]}
    suffixes = ["weight", "bias"] if config.bias else ["weight"]
    for i in range(config.n_layer):
        theirs, ours = f"model.layers.{i}.", f"blocks.{i}."
        for s in suffixes:
            q = permute_heads(hf[f"{theirs}self_attn.q_proj.{s}"], config.n_head, index)
            k = permute_heads(hf[f"{theirs}self_attn.k_proj.{s}"], config.n_kv_head, index)
            out[f"{ours}attn.qkv_proj.{s}"] = torch.cat([q, k, hf[f"{theirs}self_attn.v_proj.{s}"]])
            out[f"{ours}attn.out_proj.{s}"] = hf[f"{theirs}self_attn.o_proj.{s}"]
            out[f"{ours}mlp.fc_in.{s}"] = torch.cat([hf[f"{theirs}mlp.gate_proj.{s}"], hf[f"{theirs}mlp.up_proj.{s}"]])
            out[f"{ours}mlp.fc_out.{s}"] = hf[f"{theirs}mlp.down_proj.{s}"]
        for their_norm, our_norm in NORMS:
            out[f"{ours}{our_norm}.weight"] = hf[f"{theirs}{their_norm}.weight"]
    if not config.tie_embeddings:
        out["lm_head.weight"] = hf["lm_head.weight"]
    return out


def to_hf(state: dict[str, torch.Tensor], config: ModelConfig) -> dict[str, torch.Tensor]:
    """attngpt state -> HF LlamaForCausalLM state."""
    index = ours_rows_to_hf(config.head_dim)
    q_rows, kv_rows = config.n_head * config.head_dim, config.n_kv_head * config.head_dim
    out = {"model.embed_tokens.weight": state["tok_emb.weight"], "model.norm.weight": state["final_norm.weight"]}
    suffixes = ["weight", "bias"] if config.bias else ["weight"]
    for i in range(config.n_layer):
        theirs, ours = f"model.layers.{i}.", f"blocks.{i}."
        for s in suffixes:
            q, k, v = state[f"{ours}attn.qkv_proj.{s}"].split([q_rows, kv_rows, kv_rows])
            out[f"{theirs}self_attn.q_proj.{s}"] = permute_heads(q, config.n_head, index).contiguous()
            out[f"{theirs}self_attn.k_proj.{s}"] = permute_heads(k, config.n_kv_head, index).contiguous()
            out[f"{theirs}self_attn.v_proj.{s}"] = v.contiguous()
            out[f"{theirs}self_attn.o_proj.{s}"] = state[f"{ours}attn.out_proj.{s}"]
            gate, up = state[f"{ours}mlp.fc_in.{s}"].chunk(2)
            out[f"{theirs}mlp.gate_proj.{s}"], out[f"{theirs}mlp.up_proj.{s}"] = gate.contiguous(), up.contiguous()
            out[f"{theirs}mlp.down_proj.{s}"] = state[f"{ours}mlp.fc_out.{s}"]
        for their_norm, our_norm in NORMS:
            out[f"{theirs}{their_norm}.weight"] = state[f"{ours}{our_norm}.weight"]
    if not config.tie_embeddings:
        out["lm_head.weight"] = state["lm_head.weight"]
    return out
