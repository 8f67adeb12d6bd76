"""Hugging Face `config.json` <-> ModelConfig, for the architectures attngpt can be exactly.

    GPT2LMHeadModel      pos learned, norm layernorm, mlp gelu (tanh = HF gelu_new), biases everywhere
    LlamaForCausalLM     pos rope, norm rmsnorm, mlp swiglu, GQA; optional biases on every projection
    MistralForCausalLM   the same network as Llama when it has no sliding window

Reading takes config.json as plain JSON (no transformers needed), checks every key it reads for its type and
range first (config_schema.py), and accepts both the classic keys (`rope_theta`, `rope_scaling`) and
transformers 5's `rope_parameters`. Anything the network would compute
differently (rope scaling, a sliding window, biases on q/k/v only, another activation, ...) is refused
naming it, never approximated. Writing emits the classic keys, which transformers 4.x and 5.x both read.
"""
from __future__ import annotations

from typing import Any

from common.errors import UserError
from common.schema import check
from model.config import ModelConfig
from pretrained.hf.config_schema import KIND, SCHEMAS

ARCHITECTURES = {"GPT2LMHeadModel": "gpt2", "LlamaForCausalLM": "llama", "MistralForCausalLM": "mistral"}
SUPPORTED = "GPT2LMHeadModel, LlamaForCausalLM, MistralForCausalLM (without a sliding window)"
# why some architectures close to these are not converted
NOT_CONVERTED = {"Qwen2ForCausalLM": "biases on q, k, v only", "Qwen3ForCausalLM": "norms on q and k",
                 "GemmaForCausalLM": "RMSNorm scaled by 1 + weight, scaled embeddings",
                 "GPTNeoXForCausalLM": "parallel attention and MLP, rotary on part of each head"}
DAMAGED = "the file is damaged: fetch the model again, or correct the key"
GELU_TANH = ("gelu_new", "gelu_pytorch_tanh", "gelu_fast")  # all tanh-approximated GELU, as attngpt's GeluMLP


def hf_model_type(hf: dict[str, Any], where: str) -> str:
    """'gpt2' | 'llama' | 'mistral' for a supported config.json, else a UserError naming what it is."""
    check(hf, KIND, where, DAMAGED)
    archs = hf.get("architectures") or []
    model_type = hf.get("model_type")
    known = [ARCHITECTURES[a] for a in archs if a in ARCHITECTURES]
    if known:
        return known[0]
    if not archs and model_type in ARCHITECTURES.values():
        return model_type
    name = ", ".join(map(str, archs)) or f"model_type {model_type!r}"
    why = next((f" ({NOT_CONVERTED[a]})" for a in archs if a in NOT_CONVERTED), "")
    raise UserError(f"{where}: unsupported architecture {name}{why}; attngpt converts {SUPPORTED}")


def model_config_from_hf(hf: dict[str, Any], where: str) -> ModelConfig:
    """ModelConfig equal in every computation to the HF model described by `hf` (a config.json dict)."""
    kind = hf_model_type(hf, where)
    check(hf, SCHEMAS[kind], where, DAMAGED)  # every key read below has its type and range
    try:
        return _from_gpt2(hf, where) if kind == "gpt2" else _from_llama(hf, where, kind)
    except ValueError as e:  # ModelConfig's checks across keys: d_model divisible by n_head, ...
        raise UserError(f"{where}: not a usable {kind} config ({e})") from None


def _refuse(where: str, setting: str, why: str = "") -> None:
    raise UserError(f"{where}: {setting} has no attngpt equivalent{why}; attngpt converts {SUPPORTED}")


def _from_gpt2(hf: dict[str, Any], where: str) -> ModelConfig:
    act = hf.get("activation_function", "gelu_new")
    if act not in GELU_TANH:
        _refuse(where, f"activation_function {act!r}", " (attngpt's GELU is the tanh approximation, HF gelu_new)")
    for setting, given in (("scale_attn_by_inverse_layer_idx=true", hf.get("scale_attn_by_inverse_layer_idx")),
                           ("scale_attn_weights=false", hf.get("scale_attn_weights", True) is not True),
                           ("add_cross_attention=true", hf.get("add_cross_attention"))):
        if given:  # a setting that changes what the network computes
            _refuse(where, setting)
    return ModelConfig(
        vocab_size=hf["vocab_size"], block_size=hf["n_positions"], n_layer=hf["n_layer"], n_head=hf["n_head"],
        n_kv_head=hf["n_head"], d_model=hf["n_embd"], mlp="gelu", mlp_hidden=hf.get("n_inner"), norm="layernorm",
        pos="learned", norm_eps=float(hf.get("layer_norm_epsilon", 1e-5)), bias=True,
        tie_embeddings=hf.get("tie_word_embeddings", True))


def _rope(hf: dict[str, Any], where: str) -> float:
    """rope_theta, from the classic keys or transformers 5's rope_parameters; scaling of any kind is refused."""
    params, scaling = hf.get("rope_parameters"), hf.get("rope_scaling")
    if isinstance(params, dict) and params.get("rope_type", "default") not in ("default", None):
        _refuse(where, f"rope_parameters with rope_type {params['rope_type']!r}", " (attngpt's RoPE is unscaled)")
    kind = scaling.get("rope_type", scaling.get("type", "default")) if isinstance(scaling, dict) else None
    if kind not in ("default", None):
        _refuse(where, f"rope_scaling {kind!r}", " (attngpt's RoPE is unscaled)")
    if isinstance(params, dict) and params.get("rope_theta") is not None:
        return float(params["rope_theta"])
    return float(hf.get("rope_theta", 10000.0))


def _from_llama(hf: dict[str, Any], where: str, kind: str) -> ModelConfig:
    if hf.get("hidden_act", "silu") != "silu":
        _refuse(where, f"hidden_act {hf.get('hidden_act')!r}", " (SwiGLU gates with SiLU)")
    window = hf.get("sliding_window")
    if window is not None and (hf.get("use_sliding_window", True) and window < hf["max_position_embeddings"]):
        _refuse(where, f"sliding_window={window}", " (attention sees the whole context)")
    d_model, n_head = hf["hidden_size"], hf["num_attention_heads"]
    head_dim = hf.get("head_dim")
    if head_dim is not None and head_dim * n_head != d_model:
        _refuse(where, f"head_dim={head_dim} (with hidden_size {d_model} and {n_head} heads)",
                " (attngpt's head_dim is hidden_size / num_attention_heads)")
    attn_bias, mlp_bias = hf.get("attention_bias", False), hf.get("mlp_bias", False)
    if attn_bias != mlp_bias:
        _refuse(where, f"attention_bias={attn_bias} with mlp_bias={mlp_bias}",
                " (attngpt's bias is on every projection or none)")
    return ModelConfig(
        vocab_size=hf["vocab_size"], block_size=hf["max_position_embeddings"], n_layer=hf["num_hidden_layers"],
        n_head=n_head, n_kv_head=hf.get("num_key_value_heads") or n_head, d_model=d_model, mlp="swiglu",
        mlp_hidden=hf["intermediate_size"], norm="rmsnorm", pos="rope", rope_theta=_rope(hf, where),
        norm_eps=float(hf.get("rms_norm_eps", 1e-6)), bias=attn_bias,
        tie_embeddings=hf.get("tie_word_embeddings", False))


# --- attngpt -> Hugging Face ------------------------------------------------------------------------------

GPT2_SHAPE = {"pos": "learned", "norm": "layernorm", "mlp": "gelu"}
LLAMA_SHAPE = {"pos": "rope", "norm": "rmsnorm", "mlp": "swiglu"}


def hf_architecture(config: ModelConfig) -> str:
    """'gpt2' or 'llama': the HF architecture computing exactly what `config` does; else UserError naming the fields."""
    ours = {k: getattr(config, k) for k in GPT2_SHAPE}
    for kind, shape in (("gpt2", GPT2_SHAPE), ("llama", LLAMA_SHAPE)):
        if ours == shape:
            if kind == "gpt2" and config.n_kv_head != config.n_head:
                raise UserError(f"n_kv_head={config.n_kv_head} (grouped-query attention) has no Hugging Face "
                                f"equivalent in GPT2LMHeadModel (n_kv_head must equal n_head={config.n_head})")
            return kind
    # name the fields that differ from the nearest architecture
    nearest = min((GPT2_SHAPE, LLAMA_SHAPE), key=lambda s: sum(ours[k] != v for k, v in s.items()))
    wrong = ", ".join(f"{k}={ours[k]!r}" for k, v in nearest.items() if ours[k] != v)
    raise UserError(f"{wrong} in this configuration ({', '.join(f'{k}={v!r}' for k, v in ours.items())}) has no "
                    f"Hugging Face equivalent: GPT2LMHeadModel needs pos=learned, norm=layernorm, mlp=gelu; "
                    f"LlamaForCausalLM needs pos=rope, norm=rmsnorm, mlp=swiglu")


def hf_config_from_model(config: ModelConfig, bos_id: int | None = None, eos_id: int | None = None) -> dict[str, Any]:
    """The config.json of the HF model equal to `config` (see hf_architecture)."""
    kind = hf_architecture(config)
    common = {"vocab_size": config.vocab_size, "tie_word_embeddings": config.tie_embeddings,
              "bos_token_id": bos_id, "eos_token_id": eos_id, "torch_dtype": "float32", "use_cache": True}
    if kind == "gpt2":
        return {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "n_positions": config.block_size,
                "n_ctx": config.block_size, "n_embd": config.d_model, "n_layer": config.n_layer,
                "n_head": config.n_head, "n_inner": config.hidden_dim, "activation_function": "gelu_new",
                "layer_norm_epsilon": config.norm_epsilon, "resid_pdrop": config.dropout,
                "embd_pdrop": config.dropout, "attn_pdrop": config.dropout, "scale_attn_weights": True,
                "scale_attn_by_inverse_layer_idx": False, "reorder_and_upcast_attn": False,
                "initializer_range": 0.02, **common}
    return {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": config.d_model,
            "intermediate_size": config.hidden_dim, "num_hidden_layers": config.n_layer,
            "num_attention_heads": config.n_head, "num_key_value_heads": config.n_kv_head,
            "head_dim": config.head_dim, "max_position_embeddings": config.block_size, "hidden_act": "silu",
            "rms_norm_eps": config.norm_epsilon, "rope_theta": config.rope_theta, "rope_scaling": None,
            "attention_bias": config.bias, "mlp_bias": config.bias, "attention_dropout": config.dropout,
            "pretraining_tp": 1, "initializer_range": 0.02, **common}
