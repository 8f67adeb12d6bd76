"""How much memory a model needs, computed from its config before anything is allocated.

A config is only numbers: `vocab_size: 10**12` in a checkpoint's config.json, or an override with one digit
too many, would make `GPT(config)` try to allocate terabytes, and die in an allocator (or thrash the machine)
instead of saying what is wrong. Every loader calls `check_fits_in_memory` first (a training run for its
gradients and optimizer state too); sample.py also checks what generating its samples allocates (`generation_bytes`).
"""
from __future__ import annotations

import os

import torch

from common.errors import UserError
from common.json_file import human_size
from model.config import ModelConfig

BYTES_FP32 = 4
# a training run keeps, per parameter, the float32 weight, its gradient and AdamW's two moments
TRAINING_BYTES_PER_PARAM = 4 * BYTES_FP32
# what one block's modules and tensor objects cost beside their numbers (Python objects, tensor headers):
# 16-56 kB measured (process RSS over building 3000 tiny blocks, CPU and meta device). A config of 10**7 layers
# of width 8 has few parameters, but building it would take 500 GB and hours.
MODULE_BYTES_PER_LAYER = 64_000


def param_count(config: ModelConfig) -> int:
    """The model's distinct parameters (a tied LM head counts once), from the config alone: equal to
    GPT(config).num_params(), which tests/pretrained/test_memory.py checks over many configs."""
    d, hd, bias = config.d_model, config.head_dim, int(config.bias)
    norm = d if config.norm == "rmsnorm" else d + bias * d  # RMSNorm never has a bias
    qkv_out = (config.n_head + 2 * config.n_kv_head) * hd
    attention = d * qkv_out + bias * qkv_out + config.n_head * hd * d + bias * d
    in_width = 2 * config.hidden_dim if config.mlp == "swiglu" else config.hidden_dim  # SwiGLU: gate and up
    mlp = d * in_width + bias * in_width + config.hidden_dim * d + bias * d
    blocks = config.n_layer * (2 * norm + attention + mlp)
    embeddings = config.vocab_size * d + (config.block_size * d if config.pos == "learned" else 0)
    head = 0 if config.tie_embeddings else config.vocab_size * d
    return embeddings + blocks + norm + head


def buffer_bytes(config: ModelConfig) -> int:
    """Derived tensors the model builds beside its parameters: the RoPE table, complex64 (block_size, head_dim/2)."""
    return config.block_size * (config.head_dim // 2) * 8 if config.pos == "rope" else 0


def kv_cache_bytes(config: ModelConfig, batch_size: int, dtype_bytes: int = BYTES_FP32,
                   max_len: int | None = None) -> int:
    """What generating with a KV cache allocates: keys and values of every layer, (batch_size, n_kv_head,
    max_len, head_dim) each, and the bool causal table (max_len, max_len); max_len None: block_size."""
    max_len = config.block_size if max_len is None else max_len
    kv = 2 * config.n_layer * batch_size * config.n_kv_head * max_len * config.head_dim * dtype_bytes
    return kv + max_len ** 2


def forward_bytes(config: ModelConfig, batch_size: int, length: int, dtype_bytes: int = BYTES_FP32) -> int:
    """A lower bound on the peak of one no-grad forward pass over (batch_size, length) tokens: the tensors that
    are alive at once inside one block (each block's are freed before the next one's are made). The residual
    stream and its normed copy (B, T, d_model) each; then the larger of the attention's q, k, v (B, T,
    (n_head + 2 n_kv_head) head_dim) with, for attn_impl manual, its scores and softmax weights (B, n_head, T, T)
    in at least float32, and the MLP's input projection (B, T, hidden or 2 hidden for SwiGLU) with its
    activation (B, T, hidden). Only what is certainly allocated: fused kernels, the allocator's slack and
    temporaries come on top."""
    bt = batch_size * length
    qkv = bt * (config.n_head + 2 * config.n_kv_head) * config.head_dim * dtype_bytes
    scores = 2 * batch_size * config.n_head * length * length * max(dtype_bytes, BYTES_FP32)
    attention = qkv + (scores if config.attn_impl == "manual" else 0)
    in_width = 2 * config.hidden_dim if config.mlp == "swiglu" else config.hidden_dim
    mlp = bt * (in_width + config.hidden_dim) * dtype_bytes
    return 2 * bt * config.d_model * dtype_bytes + max(attention, mlp)


def generation_bytes(config: ModelConfig, batch_size: int, prompt_length: int, max_new_tokens: int,
                     dtype_bytes: int = BYTES_FP32, kv_cache: bool = True) -> int:
    """A lower bound on what model.generate allocates beside the weights, for batch_size rows of a prompt of
    prompt_length tokens (at most block_size) continued by max_new_tokens. The window the model sees grows to
    length = min(block_size, prompt + new tokens). With the KV cache: the cache of that length and the forward
    pass over the prompt (the prefill); without it, every step runs the forward pass over the whole window, so
    that pass at its longest. Both: the token ids (the window, the new columns and the output, int64) and each
    step's logits (B, vocab_size). It assumes the generation runs to max_new_tokens (a stop token that ends every
    row sooner needs less without the cache)."""
    prompt_length = max(1, min(prompt_length, config.block_size))
    length = min(config.block_size, prompt_length + max(max_new_tokens, 1))
    model_bytes = forward_bytes(config, batch_size, prompt_length if kv_cache else length, dtype_bytes)
    if kv_cache:
        model_bytes += kv_cache_bytes(config, batch_size, dtype_bytes, length)
    ids = 8 * batch_size * (length + prompt_length + max_new_tokens)
    logits = batch_size * config.vocab_size * dtype_bytes
    return model_bytes + ids + logits


def device_memory(device: torch.device | str) -> int:
    """Bytes the device has in all (not what is free now: the check refuses the impossible, not the tight)."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory
    if device.type == "mps":
        return int(torch.mps.recommended_max_memory())
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):  # not POSIX: no bound we can state
        return 2**62


def human_bytes(n: float) -> str:
    return human_size(n, ("B", "kB", "MB", "GB", "TB", "PB", "EB"))


def check_fits_in_memory(config: ModelConfig, device: torch.device | str = "cpu",
                         bytes_per_param: int = BYTES_FP32, extra_bytes: int = 0,
                         what: str = "its weights", source: str = "the config") -> int:
    """Raise UserError, before anything is allocated, when `config`'s model cannot fit in `device`'s memory:
    parameters x bytes_per_param (4: float32 weights; TRAINING_BYTES_PER_PARAM for a training run) + its
    buffers + its modules' own objects (MODULE_BYTES_PER_LAYER a block) + extra_bytes (e.g. a KV cache).
    Returns the bytes needed. Building the model on the meta device needs this check too: a model that passes
    it has no tensor whose storage size overflows. `what` and `source` word the message:
    what the bytes hold, and where the config came from (e.g. "config.json in 'runs/x/best'")."""
    n_params = param_count(config)
    needed = n_params * bytes_per_param + buffer_bytes(config) + config.n_layer * MODULE_BYTES_PER_LAYER + extra_bytes
    available = device_memory(device)
    if needed > available:
        shape = (f"vocab_size={config.vocab_size}, block_size={config.block_size}, n_layer={config.n_layer}, "
                 f"d_model={config.d_model}")
        raise UserError(f"the model in {source} has {n_params:,} parameters ({shape}): {what} would need "
                        f"{human_bytes(needed)}, but {device} has {human_bytes(available)} in all. "
                        f"Is the config damaged? Otherwise make the model smaller")
    return needed
