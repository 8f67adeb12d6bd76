"""attngpt's model: a GPT on a from-scratch causal attention block.

The names below are imported on first use (PEP 562): `import model.config`, which every config check
needs, then stays free of torch, whose import takes seconds. A typo in a config key is reported before
torch has loaded; `from model import GPT` works as usual.
"""
from __future__ import annotations

import importlib

_EXPORTS = {
    "GPT": "model.gpt",
    "ModelConfig": "model.config",
    "CausalSelfAttention": "model.gpt",
    "KVCache": "model.gpt",
    "scaled_dot_product_attention": "model.gpt",
    "causal_mask": "model.gpt",
    "repeat_kv": "model.gpt",
    "AttentionInternals": "model.gpt",
    "HeadPatch": "model.gpt",
}

__all__ = list(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'model' has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
