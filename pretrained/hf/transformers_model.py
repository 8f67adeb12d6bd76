"""The transformers model (GPT2LMHeadModel / LlamaForCausalLM) equal to an attngpt GPT, built in memory:
for comparing against Hugging Face (logits, `generate`, speed) with identical weights.

    from pretrained.hf.transformers_model import to_transformers
    hf_model = to_transformers(model)            # eval mode, same device and dtype as model
"""
from __future__ import annotations

from typing import Any

from common.errors import UserError
from model.gpt import GPT
from pretrained.hf.config_map import hf_config_from_model
from pretrained.hf.export import hf_state_dict

HF_EXTRA = "pip install -e '.[hf]'"


def to_transformers(model: GPT, attn_implementation: str | None = None) -> Any:
    """A transformers model with `model`'s weights (copied), in eval mode, on its device and dtype.
    attn_implementation: e.g. "eager" or "sdpa" (transformers' default when None)."""
    try:
        import transformers
    except ImportError:
        raise UserError(f"this needs the transformers package: {HF_EXTRA}") from None
    hf_cfg = {k: v for k, v in hf_config_from_model(model.config).items() if k != "architectures"}
    config = transformers.AutoConfig.for_model(hf_cfg.pop("model_type"), **hf_cfg)
    kwargs = {"attn_implementation": attn_implementation} if attn_implementation else {}
    param = model.tok_emb.weight
    hf_model = transformers.AutoModelForCausalLM.from_config(config, **kwargs).to(param.dtype)
    result = hf_model.load_state_dict({k: v.detach().clone() for k, v in hf_state_dict(model).items()},
                                      strict=False)
    tied = {"lm_head.weight"} if model.config.tie_embeddings else set()
    if set(result.missing_keys) - tied or result.unexpected_keys:
        raise RuntimeError(f"transformers model does not fit: missing {result.missing_keys}, "
                           f"unexpected {result.unexpected_keys}")
    if model.config.tie_embeddings:
        hf_model.tie_weights()
    return hf_model.to(param.device).eval()
