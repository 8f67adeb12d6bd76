"""attngpt's model: a GPT on a from-scratch causal attention block."""
from model.attention import AttentionInternals, CausalSelfAttention, causal_mask, repeat_kv, scaled_dot_product_attention
from model.config import ModelConfig
from model.gpt import GPT
from model.kv_cache import KVCache

__all__ = ["GPT", "ModelConfig", "CausalSelfAttention", "KVCache", "scaled_dot_product_attention",
           "causal_mask", "repeat_kv", "AttentionInternals"]
