"""GPT-2 weights: Hugging Face GPT2LMHeadModel names <-> attngpt names.

HF GPT-2 keeps its projections in `Conv1D` modules whose weight is (in, out): the transpose of an
nn.Linear's (out, in). Its fused c_attn already holds q | k | v in attngpt's order, each head's rows
contiguous, so only the transpose differs. attngpt without biases (bias=False) is GPT-2 with zero biases.
"""
from __future__ import annotations

import re

import torch

from model.config import ModelConfig

LAYER_NAME = re.compile(r"transformer\.h\.(\d+)\.")  # normalized names of layer i: transformer.h.i.*
PREFIX = "transformer."
# per-layer pairs (HF name under h.{i}., attngpt name under blocks.{i}., transposed?)
LAYER = [
    ("ln_1.weight", "attn_norm.weight", False), ("ln_1.bias", "attn_norm.bias", False),
    ("attn.c_attn.weight", "attn.qkv_proj.weight", True), ("attn.c_attn.bias", "attn.qkv_proj.bias", False),
    ("attn.c_proj.weight", "attn.out_proj.weight", True), ("attn.c_proj.bias", "attn.out_proj.bias", False),
    ("ln_2.weight", "mlp_norm.weight", False), ("ln_2.bias", "mlp_norm.bias", False),
    ("mlp.c_fc.weight", "mlp.fc_in.weight", True), ("mlp.c_fc.bias", "mlp.fc_in.bias", False),
    ("mlp.c_proj.weight", "mlp.fc_out.weight", True), ("mlp.c_proj.bias", "mlp.fc_out.bias", False),
]
TOP = [("wte.weight", "tok_emb.weight"), ("wpe.weight", "pos_emb.weight"),
       ("ln_f.weight", "final_norm.weight"), ("ln_f.bias", "final_norm.bias")]


def is_buffer(name: str) -> bool:
    """Causal-mask buffers that older GPT-2 checkpoints saved beside the weights (h.N.attn.bias, 4-D)."""
    return name.endswith((".attn.bias", ".attn.masked_bias")) and ".c_attn" not in name


def normalize_name(name: str) -> str:
    """Hub checkpoints name weights `h.0...`, save_pretrained `transformer.h.0...`: one spelling."""
    return name if name.startswith(PREFIX) or name == "lm_head.weight" else PREFIX + name


def _pairs(config: ModelConfig) -> list[tuple[str, str, bool]]:
    """(HF name, attngpt name, transposed?) of every stored tensor (a tied head has none)."""
    pairs = [(PREFIX + theirs, ours, False) for theirs, ours in TOP]
    pairs += [(f"{PREFIX}h.{i}.{theirs}", f"blocks.{i}.{ours}", transpose)
              for i in range(config.n_layer) for theirs, ours, transpose in LAYER]
    return pairs if config.tie_embeddings else [*pairs, ("lm_head.weight", "lm_head.weight", False)]


def from_hf(hf: dict[str, torch.Tensor], config: ModelConfig) -> dict[str, torch.Tensor]:
    """HF state (normalized names) -> attngpt state (the names GPT.state_dict uses; a tied head left out)."""
    return {ours: hf[theirs].t().contiguous() if t else hf[theirs] for theirs, ours, t in _pairs(config)}


def to_hf(state: dict[str, torch.Tensor], config: ModelConfig) -> dict[str, torch.Tensor]:
    """attngpt state -> HF GPT2LMHeadModel state; absent biases (bias=False) become zeros."""
    def get(name: str) -> torch.Tensor:
        if name in state:
            return state[name]
        weight = state[name.removesuffix("bias") + "weight"]  # a bias the model does not have: zeros
        return torch.zeros(weight.shape[0], dtype=weight.dtype, device=weight.device)

    return {theirs: get(ours).t().contiguous() if t else get(ours) for theirs, ours, t in _pairs(config)}
