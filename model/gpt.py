"""GPT: a decoder-only transformer built on the from-scratch attention block.

tokens -> embedding (+ learned positions) -> n_layer pre-norm blocks -> final norm -> LM head -> logits
Each block: x = x + attention(norm(x)); x = x + mlp(norm(x)).
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from model.attention import AttentionInternals, CausalSelfAttention
from model.config import ModelConfig
from model.kv_cache import KVCache
from model.mlp import make_mlp
from model.norm import make_norm
from model.rope import rope_frequencies


HEAD_COLUMNS_MAX_ROWS = 8  # up to this many rows (decode steps of small batches) use GPT.head_columns on a CPU


class Block(nn.Module):
    """One transformer layer: attention then MLP, each on a normalised copy of the residual stream."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.attn_norm = make_norm(config.norm, config.d_model, config.bias, config.norm_eps)
        self.attn = CausalSelfAttention(config)
        self.mlp_norm = make_norm(config.norm, config.d_model, config.bias, config.norm_eps)
        self.mlp = make_mlp(config)

    def forward(self, x, rope=None, mask=None, input_pos=None, need_weights=False):
        attn_out, weights = self.attn(self.attn_norm(x), rope, mask, input_pos, need_weights)
        x = x + attn_out
        x = x + self.mlp(self.mlp_norm(x))
        return x, weights


class GPT(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = config
        self.tok_emb = nn.Embedding(config.vocab_size, config.d_model)
        self.pos_emb = nn.Embedding(config.block_size, config.d_model) if config.pos == "learned" else None
        self.emb_dropout = nn.Dropout(config.dropout)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.n_layer))
        self.final_norm = make_norm(config.norm, config.d_model, config.bias, config.norm_eps)
        self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        if config.tie_embeddings:
            # one matrix maps tokens to vectors and vectors back to token scores (Press & Wolf 2017)
            self.lm_head.weight = self.tok_emb.weight
        if config.pos == "rope":
            # (cos, sin) per position and channel pair, float32 (block_size, head_dim/2, 2); derived, so not saved
            self.register_buffer("rope_freqs", rope_frequencies(config.head_dim, config.block_size,
                                                                config.rope_theta), persistent=False)
        self.causal_table = None  # bool (max_len, max_len), set with the KV cache
        self.init_weights()

    def init_weights(self) -> None:
        """GPT-2's initialisation, in one place.

        - every Linear and Embedding weight ~ N(0, 0.02), biases 0: small enough that the first
          logits are near uniform (initial loss ~ ln(vocab_size));
        - the two projections that write into the residual stream (attention out_proj, MLP fc_out)
          get std 0.02 / sqrt(2 * n_layer): the stream sums 2 * n_layer of them, so its variance at
          init stays independent of depth (GPT-2 paper, section 2.3);
        - norm weights 1, norm biases 0.
        """
        residual_std = 0.02 / math.sqrt(2 * self.config.n_layer)
        for name, module in self.named_modules():
            if isinstance(module, nn.Linear):
                std = residual_std if name.endswith(("out_proj", "fc_out")) else 0.02
                nn.init.normal_(module.weight, mean=0.0, std=std)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, nn.Embedding):
                nn.init.normal_(module.weight, mean=0.0, std=0.02)
        for name, param in self.named_parameters():
            if "norm" in name:
                nn.init.ones_(param) if name.endswith("weight") else nn.init.zeros_(param)

    def _apply(self, fn, *args, **kwargs):
        """`model.to(torch.bfloat16)` would cast the RoPE table too, losing the precision long contexts need
        (and the float32 layout eager RoPE reads as complex numbers): rebuild it, float32, on the new device
        after any such conversion. Pooled KV caches and a compiled decode step belong to the old device and
        dtype: dropped."""
        for cached in ("_kv_pool", "_compiled_decode", "_head_columns"):
            self.__dict__.pop(cached, None)
        had_rope = self._buffers.pop("rope_freqs", None) is not None
        module = super()._apply(fn, *args, **kwargs)
        if had_rope:
            self.register_buffer("rope_freqs", rope_frequencies(
                self.config.head_dim, self.config.block_size, self.config.rope_theta,
                device=self.tok_emb.weight.device), persistent=False)
        return module

    # ----------------------------------------------------------------------------------------------
    def _hidden(self, idx: torch.Tensor, input_pos: torch.Tensor | None = None,
                record: set[int] | frozenset[int] = frozenset(),
                kv_len: int | None = None) -> tuple[torch.Tensor, dict[int, torch.Tensor]]:
        """idx (B, T) -> final hidden states (B, T, d_model) and the attention weights of the layers in
        `record`, each (B, n_head, T, T_k). Weights are only computed for those layers.
        kv_len: with a KV cache, how many of its slots the queries attend over. By default eager code takes
        the written prefix, max(input_pos) + 1, and compiled code the whole buffer; a compiled CPU decode
        step passes it as a dynamic size (model/generate.py)."""
        B, T = idx.shape
        caching = self.blocks[0].attn.kv_cache is not None
        if input_pos is None:
            if caching:
                raise ValueError("a KV cache is set up: pass input_pos, the positions of idx's tokens")
            if T > self.config.block_size:
                raise ValueError(f"sequence of {T} tokens is longer than block_size={self.config.block_size}")
            positions = torch.arange(T, device=idx.device)
            mask = None  # plain causal attention over idx itself
        else:
            positions = input_pos  # (T,) absolute positions of idx's tokens
            # With a cache, query row i sees the keys written at positions <= input_pos[i] (bottom-right
            # aligned causal attention over the buffer); without one, idx only sees itself.
            mask = self.causal_table[input_pos] if caching else None
            if caching and kv_len is None and not torch.compiler.is_compiling():
                kv_len = int(input_pos.max()) + 1  # eager: the written prefix
            if caching and kv_len is not None:
                mask = mask[:, :kv_len]

        x = self._embed(idx, positions)  # (B, T, d_model)
        rope = self._rope(T, input_pos)

        maps: dict[int, torch.Tensor] = {}
        for layer, block in enumerate(self.blocks):
            x, weights = block(x, rope, mask, input_pos, need_weights=layer in record)
            if weights is not None:
                maps[layer] = weights
        return self.final_norm(x), maps

    def _embed(self, idx: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Token ids (B, T) at absolute positions (T,) -> the residual stream entering block 0, (B, T, d_model)."""
        x = self.tok_emb(idx)
        if self.pos_emb is not None:
            x = x + self.pos_emb(positions)
        return self.emb_dropout(x)

    def _rope(self, T: int, input_pos: torch.Tensor | None = None) -> torch.Tensor | None:
        """The RoPE rotations (T, head_dim/2, 2) of positions 0..T-1, or of input_pos; None without RoPE."""
        if self.config.pos != "rope":
            return None
        return self.rope_freqs[:T] if input_pos is None else self.rope_freqs[input_pos]

    def residual_stream(self, idx: torch.Tensor) -> list[torch.Tensor]:
        """The residual stream of a plain forward pass over idx (B, T): n_layer + 1 tensors (B, T, d_model),
        entry l the input of block l and the last one the last block's output (before the final norm).
        With `hidden_from` it lets an intervention in layer l re-run layers l.. only (insight/ablation.py)."""
        T = idx.shape[1]
        self._check_plain_pass("residual_stream", T)
        stream = [self._embed(idx, torch.arange(T, device=idx.device))]  # (B, T, d_model) each
        rope = self._rope(T)
        for block in self.blocks:
            stream.append(block(stream[-1], rope)[0])
        return stream

    def _check_plain_pass(self, name: str, T: int) -> None:
        if self.blocks[0].attn.kv_cache is not None:
            raise ValueError(f"{name} runs without a KV cache: call clear_kv_cache() first")
        if T > self.config.block_size:
            raise ValueError(f"sequence of {T} tokens is longer than block_size={self.config.block_size}")

    def hidden_from(self, layer: int, x: torch.Tensor) -> torch.Tensor:
        """Final hidden states (B, T, d_model) from x (B, T, d_model), the residual stream entering block
        `layer` (residual_stream(idx)[layer]): blocks layer..n_layer-1 (plain causal attention over x's T
        positions 0..T-1, no cache) and the final norm. hidden_from(0, residual_stream(idx)[0]) computes
        what forward(idx) does. Pass logits() the result for token scores."""
        self._layer_list([layer])
        self._check_plain_pass("hidden_from", x.shape[1])
        rope = self._rope(x.shape[1])
        for block in self.blocks[layer:]:
            x = block(x, rope)[0]
        return self.final_norm(x)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None,
                input_pos: torch.Tensor | None = None,
                last_only: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        """idx (B, T) token ids -> (logits (B, T, vocab_size), mean cross-entropy against targets or None).
        Targets equal to -1 are ignored. With a KV cache, input_pos (T,) gives idx's positions.
        last_only: logits of the last position only, (B, 1, vocab_size): all that sampling needs, and
        the vocab-wide lm_head is the largest matmul of a prefill (the hidden states are the same)."""
        x, _ = self._hidden(idx, input_pos)
        if last_only:
            if targets is not None:
                raise ValueError("last_only gives one position's logits: it cannot compute a loss over targets")
            x = x[:, -1:]  # (B, 1, d_model)
        logits = self.logits(x)  # (B, T, vocab_size), or (B, 1, vocab_size) with last_only
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(), ignore_index=-1)
        return logits, loss

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        """Final hidden states (B, T, d_model) -> logits (B, T, vocab_size) through the LM head.

        Decoding on a CPU (no grad, a handful of rows) multiplies by the head's weight stored column-major
        instead, x @ W^T with W^T contiguous: the product then streams the vocab-wide matrix once, row after row
        of W^T, where F.linear computes vocab_size short dot products, about twice as slow on a CPU for one row
        (benchmarks/RESULTS.md). The same numbers in another summation order; the copy is made once and kept
        until the weight changes (its version counter moves on any in-place update)."""
        if x.device.type == "cpu" and not torch.is_grad_enabled() and not torch.compiler.is_compiling() \
                and x.shape[:-1].numel() <= HEAD_COLUMNS_MAX_ROWS:
            return x @ self.head_columns()
        return self.lm_head(x)

    def head_columns(self) -> torch.Tensor:
        """The LM head's weight transposed and contiguous, (d_model, vocab_size): cached, rebuilt after any
        change to the weight (a training step, load_state_dict, a cast or a move)."""
        weight = self.lm_head.weight
        key = (weight.data_ptr(), weight._version, weight.dtype, weight.device)
        cached = self.__dict__.get("_head_columns")
        if cached is None or cached[0] != key:
            with torch.no_grad():
                cached = self.__dict__["_head_columns"] = (key, weight.detach().t().contiguous())
        return cached[1]

    @torch.no_grad()
    def attention_maps(self, idx: torch.Tensor, layers: list[int] | None = None) -> dict[int, torch.Tensor]:
        """Attention weights {layer: (B, n_head, T, T)} of `layers` (default all) for idx (B, T), computed
        by the from-scratch path whatever attn_impl is. Runs in eval mode (no dropout), then restores."""
        layers = self._layer_list(layers)
        was_training = self.training
        self.eval()
        try:
            _, maps = self._hidden(idx, record=set(layers))
        finally:
            self.train(was_training)
        return {layer: maps[layer].float() for layer in layers}

    @torch.no_grad()
    def attention_internals(self, idx: torch.Tensor, layers: list[int] | None = None) -> dict[int, AttentionInternals]:
        """Everything the attention of `layers` (default all) computed over idx (B, T), by the from-scratch
        path in eval mode: per layer q, k (RoPE applied), v, the weights (as attention_maps returns them)
        and out_proj's weight and bias (see AttentionInternals). For inspection: the step-by-step
        arithmetic and value-weighted attention (insight/) are computed from these. q, k, v are what the
        layer's own projection (CausalSelfAttention.project_qkv) returns for the input it received."""
        layers = self._layer_list(layers)
        found: dict[int, AttentionInternals] = {}

        def capture(layer: int):
            def hook(attn, args, kwargs, output):
                x = args[0] if args else kwargs["x"]
                rope = args[1] if len(args) > 1 else kwargs.get("rope")
                q, k, v = attn.project_qkv(x, rope)
                bias = attn.out_proj.bias
                # copies: under FSDP the gathered weights are freed once the block's forward ends
                found[layer] = AttentionInternals(q=q, k=k, v=v, weights=output[1].float(),
                                                  out_weight=attn.out_proj.weight.detach().clone(),
                                                  out_bias=None if bias is None else bias.detach().clone())
            return hook

        handles = [self.blocks[layer].attn.register_forward_hook(capture(layer), with_kwargs=True)
                   for layer in layers]
        was_training = self.training
        self.eval()
        try:
            self._hidden(idx, record=set(layers))
        finally:
            self.train(was_training)
            for handle in handles:
                handle.remove()
        return {layer: found[layer] for layer in layers}

    def _layer_list(self, layers: list[int] | None) -> list[int]:
        """layers (default all), each checked against n_layer."""
        layers = list(range(self.config.n_layer)) if layers is None else list(layers)
        for layer in layers:
            if not 0 <= layer < self.config.n_layer:
                raise ValueError(f"layer {layer} out of range: the model has layers 0..{self.config.n_layer - 1}")
        return layers

    # ----------------------------------------------------------------------------------------------
    def setup_kv_cache(self, batch_size: int, max_len: int | None = None, dtype: torch.dtype | None = None,
                       device: torch.device | str | None = None) -> int:
        """Give every layer a preallocated KV cache; returns its total size in bytes.

        dtype: the cache's own, the model's by default; a narrower one (bfloat16 under a float32 model) halves
        its memory, and attention reads it back in the dtype it computes in.

        Caches of the same shape, dtype and device as the last ones are reused (zeroed), not reallocated:
        compiled decode steps (model/generate.py) guard on the cache buffers they were traced with."""
        max_len = self.config.block_size if max_len is None else max_len
        if not 1 <= max_len <= self.config.block_size:
            raise ValueError(f"max_len={max_len}: must be in 1..block_size={self.config.block_size}")
        param = self.tok_emb.weight
        dtype = dtype or param.dtype
        device = torch.device(device or param.device)
        key = (batch_size, max_len, dtype, device)
        pool = self.__dict__.get("_kv_pool")  # (key, caches, causal table) of the last setup
        if pool is not None and pool[0] == key:
            caches, self.causal_table = pool[1], pool[2]
            for cache in caches:
                cache.reset()
        else:
            caches = [KVCache(batch_size, self.config.n_kv_head, max_len, self.config.head_dim, dtype=dtype,
                              device=device) for _ in self.blocks]
            self.causal_table = torch.ones(max_len, max_len, dtype=torch.bool, device=device).tril()
            self.__dict__["_kv_pool"] = (key, caches, self.causal_table)
        for block, cache in zip(self.blocks, caches):
            block.attn.kv_cache = cache
        return sum(cache.nbytes() for cache in caches)

    def clear_kv_cache(self) -> None:
        """Back to plain forward passes (the buffers stay pooled for the next setup_kv_cache)."""
        for block in self.blocks:
            block.attn.kv_cache = None
        self.causal_table = None

    def set_fused_attention_float32(self, on: bool) -> None:
        """Every layer's fused attention kernel on float32 copies of q, k, v under a lower-precision autocast,
        or not (model.attention.fused_attention): a speed setting of the machine, not of the model."""
        for block in self.blocks:
            block.attn.fused_float32 = bool(on)

    # ----------------------------------------------------------------------------------------------
    def num_params(self, exclude_embeddings: bool = False) -> int:
        """Distinct parameters (a tied LM head counts once). exclude_embeddings drops the token and
        position tables, as scaling-law papers count."""
        n = sum(p.numel() for p in self.parameters())
        if exclude_embeddings:
            n -= self.tok_emb.weight.numel()
            if self.pos_emb is not None:
                n -= self.pos_emb.weight.numel()
        return n

    def flops_per_token(self, seq_len: int | None = None) -> float:
        """Training FLOPs (forward + backward) per token, for MFU (PaLM paper, appendix B).

        6 per weight of every matmul (2 forward, 4 backward), the LM head included even when tied;
        plus attention's two matmuls (QK^T and weights @ V): 12 * n_layer * n_head * head_dim * seq_len,
        counted over the full square as is customary, though the causal half is masked.
        """
        c = self.config
        seq_len = c.block_size if seq_len is None else seq_len
        matmul_params = sum(m.weight.numel() for m in self.modules() if isinstance(m, nn.Linear))
        return 6.0 * matmul_params + 12.0 * c.n_layer * c.n_head * c.head_dim * seq_len



def crop_block_size(state: dict[str, torch.Tensor], block_size: int) -> dict[str, torch.Tensor]:
    """A GPT's weights for the same model at a shorter context (fine-tuning GPT-2 at the context a CPU affords):
    learned positions keep the first block_size rows of their table. Nothing else stored depends on the
    context (RoPE's table is derived, not saved), so GPT(config at block_size) holding the result computes, on
    every input of up to block_size tokens, exactly what the full model computes."""
    positions = state.get("pos_emb.weight")  # (source block_size, d_model); absent with RoPE
    if positions is None or positions.shape[0] == block_size:
        return state
    if not 1 <= block_size < positions.shape[0]:
        raise ValueError(f"block_size={block_size}: the weights hold {positions.shape[0]} positions; a crop keeps "
                         f"1 to {positions.shape[0]} of them")
    return {**state, "pos_emb.weight": positions[:block_size].clone()}  # a copy: the full table can be freed
