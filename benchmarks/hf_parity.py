"""attngpt against Hugging Face transformers with identical weights, at real model shapes: logits, greedy
tokens, and sampling speed (attngpt's KV cache vs transformers' `generate`).

Why: the tests prove the conversion on tiny models on a CPU; this checks it where users run it (GPT-2 124M, a 1B
Llama with GQA, on a GPU), and gives the speed work a like-for-like baseline. Weights are random (no download),
norms and biases moved off 1 and 0, q/k/v scaled for attention scores of std ~3 (peaked like a trained model's,
where GPT-2's init gives near-uniform attention); the transformers model is built from them in memory
(pretrained.hf.transformers_model.to_transformers). Per model: max |logit difference| in float32 (and float64,
below 500M parameters: rounding aside, the two compute the same function) over 2 x 256 random tokens; whether
`--new-tokens` greedy tokens are identical; tokens/s of both (greedy, batch 1, 16-token prompt, bfloat16 on a
GPU, float32 on a CPU; median of 3). Reported, never asserted; --save appends a section to RESULTS.md.

    python benchmarks/hf_parity.py [--device cuda] [--models gpt2-124m,llama-1b] [--new-tokens 100] [--save]
"""
from __future__ import annotations

import argparse
import math

import torch

import _report
from common.device import resolve_device
from model import GPT, ModelConfig
from model.generate import generate
from pretrained.hf.transformers_model import to_transformers

SHAPES = {
    "gpt2-124m": ModelConfig(vocab_size=50257, block_size=1024, n_layer=12, n_head=12, d_model=768, pos="learned",
                             norm="layernorm", mlp="gelu", bias=True, attn_impl="sdpa"),
    "llama-1b": ModelConfig(vocab_size=32000, block_size=2048, n_layer=22, n_head=32, n_kv_head=4, d_model=2048,
                            mlp_hidden=5632, pos="rope", norm="rmsnorm", mlp="swiglu", norm_eps=1e-5,
                            tie_embeddings=False, attn_impl="sdpa"),
    "tiny-gpt2": ModelConfig(vocab_size=500, block_size=256, n_layer=2, n_head=4, d_model=64, pos="learned",
                             norm="layernorm", mlp="gelu", bias=True),
    "tiny-llama": ModelConfig(vocab_size=500, block_size=256, n_layer=2, n_head=4, n_kv_head=2, d_model=64,
                              pos="rope", norm="rmsnorm", mlp="swiglu", tie_embeddings=False),
}


def random_model(config: ModelConfig, device: torch.device) -> GPT:
    torch.manual_seed(0)
    model = GPT(config).to(device).eval()
    qkv_scale = 1.7 / (0.02 * math.sqrt(config.d_model))  # q, k entries of std ~1.7: scores of std ~3
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim == 1:
                p.add_(torch.randn_like(p) * 0.3)
            elif "qkv_proj" in name:
                p.mul_(qkv_scale)
    return model


def compare(name: str, device: torch.device, new_tokens: int) -> dict[str, object]:
    model = random_model(SHAPES[name], device)
    hf = to_transformers(model, attn_implementation="sdpa")
    hf.generation_config.eos_token_id = None
    hf.generation_config.pad_token_id = 0
    idx = torch.randint(0, model.config.vocab_size, (2, 256), generator=torch.Generator().manual_seed(1)).to(device)
    with torch.no_grad():
        diff = (model(idx)[0] - hf(idx).logits).abs().max().item()
        diff64 = "-"
        if model.num_params() < 5e8:
            diff64 = f"{(model.double()(idx)[0] - hf.double()(idx).logits).abs().max().item():.1e}"
            model, hf = model.float(), hf.float()
    prompt = idx[:1, :16]
    ours = generate(model, prompt, new_tokens, temperature=0.0)
    theirs = hf.generate(prompt, max_new_tokens=new_tokens, do_sample=False, attention_mask=torch.ones_like(prompt))
    same = ours.tolist() == theirs.tolist()
    first_diff = next((i for i, (a, b) in enumerate(zip(ours[0].tolist(), theirs[0].tolist())) if a != b), None)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    model, hf = model.to(dtype), hf.to(dtype)
    t_ours = _report.median_seconds(lambda: generate(model, prompt, new_tokens, temperature=0.0), 3, device)
    t_hf = _report.median_seconds(lambda: hf.generate(prompt, max_new_tokens=new_tokens, do_sample=False,
                                                      attention_mask=torch.ones_like(prompt)), 3, device)
    return {"model": name, "params": f"{model.num_params() / 1e6:.0f}M", "max_logit_diff": f"{diff:.1e}",
            "fp64_diff": diff64,
            "greedy_equal": f"{same}" + ("" if same else f" (first difference at token {first_diff - 16})"),
            "dtype": str(dtype).replace("torch.", ""), "attngpt_tok_s": f"{new_tokens / t_ours:.0f}",
            "hf_tok_s": f"{new_tokens / t_hf:.0f}"}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cpu")
    p.add_argument("--models", default="gpt2-124m,llama-1b", help=f"comma-separated: {', '.join(SHAPES)}")
    p.add_argument("--new-tokens", type=int, default=100)
    p.add_argument("--save", action="store_true", help="append a section to benchmarks/RESULTS.md")
    args = p.parse_args()
    device = resolve_device(args.device, setting="--device ")
    rows = [compare(name, device, args.new_tokens) for name in args.models.split(",")]
    keys = list(rows[0])
    table = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    table += ["| " + " | ".join(str(r[k]) for k in keys) + " |" for r in rows]
    print("\n".join(table))
    if args.save:
        name = torch.cuda.get_device_name(0) if device.type == "cuda" else _report.machine()
        _report.append_section([f"## attngpt vs transformers, identical weights ({_report.timestamp()})", "",
                                f"Machine: {name}; transformers {_report.package_version('transformers')}. "
                                f"Command: `{_report.command('hf_parity.py')}`", "", *table])


if __name__ == "__main__":
    main()
