"""attngpt's composition scores (insight/circuits.py) against TransformerLens's `all_composition_scores` on the
same weights, exported with `convert.py to-hf` and loaded by TransformerLens's TransformerBridge.

Why: composition_scores folds the norms' gains (and LayerNorm's centring) into the weights itself and reads its
own qkv layout; TransformerLens folds them in its own weight processing (`enable_compatibility_mode`) from the
Hugging Face layout. Two independent routes to the same number check the folding, the head layout (GQA, and
the RoPE row permutation the Llama export makes inside each head) and the formula.

Models: random ones (no download) with the norms' gains drawn from [0.5, 1.5] and biases off 0, so that the
folding matters: Llama-architecture (RoPE, RMSNorm, SwiGLU) with MHA and with GQA, and GPT-2-architecture
(learned positions, LayerNorm with biases, GELU); `--ckpt` adds trained checkpoints (a run's out_dir). Each is
compared with TransformerLens in float32 (its default) and float64. attngpt is called with group_kv=False (k
and v targets per query head, TransformerLens's layout) and rope_offsets=(0,) (the unrotated weights:
TransformerLens ignores RoPE); its default rope_offsets=None (every query-key distance side by side) is a
different quantity on a RoPE model, reported beside. Exits 1 if any max |attngpt - TL| exceeds --tolerance.

TransformerLens is not a project dependency; install it in a venv of its own, the project importable there:

    python -m venv /tmp/tl-venv
    /tmp/tl-venv/bin/pip install 'torch==2.13.0' --index-url https://download.pytorch.org/whl/cpu
    /tmp/tl-venv/bin/pip install 'transformer-lens>=4' tiktoken matplotlib
    /tmp/tl-venv/bin/python benchmarks/circuits_vs_transformer_lens.py [--ckpt runs/induction] [--save]

Without transformer_lens the script says so in one line and exits 0 (tests/benchmarks/ runs it either way).
"""
from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import io
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

import _report
from data.tokenizer import CharTokenizer
from insight.circuits import COMPOSITION_KINDS, composition_scores
from model import GPT, ModelConfig
from pretrained.checkpoint import load_checkpoint, save_model

SCRIPT = "circuits_vs_transformer_lens.py"
CHARS = "".join(chr(c) for c in range(32, 102))  # a char vocabulary: the export writes its tokenizer.json
DTYPES = {"float32": torch.float32, "float64": torch.float64}


def shapes(quick: bool) -> dict[str, ModelConfig]:
    layers, d_model = (2, 16) if quick else (4, 64)
    common = dict(vocab_size=len(CHARS), block_size=32, n_layer=layers, n_head=4, d_model=d_model)
    llama = dict(pos="rope", norm="rmsnorm", mlp="swiglu")
    return {"llama-mha": ModelConfig(**common, **llama),
            "llama-gqa": ModelConfig(**common, n_kv_head=2, **llama),
            "gpt2": ModelConfig(**common, pos="learned", norm="layernorm", mlp="gelu", bias=True)}


def random_model(config: ModelConfig) -> GPT:
    """A GPT with its norms' gains in [0.5, 1.5] and its biases off 0: gains of 1 would leave the folding
    unchecked."""
    torch.manual_seed(0)
    model = GPT(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name and name.endswith("weight"):
                p.uniform_(0.5, 1.5)
            elif p.ndim == 1:
                p.normal_(0.0, 0.1)
    return model


def export(model_folder: Path, out_dir: Path) -> None:
    """`python convert.py to-hf MODEL_FOLDER OUT_DIR`, through the command's own entry point."""
    import convert

    with contextlib.redirect_stdout(io.StringIO()):  # its one 'wrote ...' line
        if convert.main(["to-hf", str(model_folder), str(out_dir)]) != 0:
            raise SystemExit(f"convert.py to-hf {model_folder} failed")


def transformer_lens_scores(hf_folder: Path, dtype: torch.dtype) -> dict[str, np.ndarray]:
    """{kind: all_composition_scores(KIND)} of the bridge booted from hf_folder with the norms folded, float64
    numpy (L, H, L, H), 0 where the source layer is not below the target's."""
    from transformer_lens.model_bridge import TransformerBridge
    from transformers.utils import logging

    logging.disable_progress_bar()  # transformers' "Loading weights" bar, once per boot
    bridge = TransformerBridge.boot_transformers(str(hf_folder), device="cpu", dtype=dtype)
    bridge.enable_compatibility_mode(disable_warnings=True)  # fold_ln + centring, as HookedTransformer loads
    with torch.no_grad():
        return {kind: bridge.all_composition_scores(kind.upper()).scores.detach().double().numpy()
                for kind in COMPOSITION_KINDS}


def max_difference(ours: np.ndarray, theirs: np.ndarray) -> float:
    """max |ours - theirs| over the pairs both define (source layer < target layer); inf if the layouts differ:
    a shape, or which pairs are defined (NaN in ours, 0 in TransformerLens's)."""
    defined = ~np.isnan(ours)
    upper = np.arange(ours.shape[0])[:, None, None, None] < np.arange(ours.shape[2])[None, None, :, None]
    if ours.shape != theirs.shape or not np.array_equal(defined, np.broadcast_to(upper, ours.shape)):
        return float("inf")
    if np.any(theirs[~defined] != 0):
        return float("inf")
    return float(np.abs(ours[defined] - theirs[defined]).max())


def compare(name: str, model: GPT, hf_folder: Path, dtypes: list[str]) -> list[dict[str, object]]:
    """One row per dtype: max |attngpt - TL| per kind, and on a RoPE model how far attngpt's default
    rope_offsets=None (every distance) is from TL's unrotated score."""
    ours = composition_scores(model, group_kv=False, rope_offsets=(0,))
    rows = []
    for dtype in dtypes:
        theirs = transformer_lens_scores(hf_folder, DTYPES[dtype])
        row = {"model": name, "dtype": dtype, **{kind: max_difference(ours[kind], theirs[kind])
                                                 for kind in COMPOSITION_KINDS}}
        row["max score"] = float(np.nanmax(ours["q"]))
        if model.config.pos == "rope":
            every_distance = composition_scores(model, group_kv=False)
            row["default"] = max(max_difference(every_distance[kind], theirs[kind]) for kind in ("q", "k"))
        rows.append(row)
    return rows


def models(args: argparse.Namespace, work: Path) -> list[tuple[str, GPT, Path]]:
    """(name, model, its exported Hugging Face folder) for each random shape asked for and each --ckpt."""
    out = []
    for name, config in shapes(args.quick).items():
        if name not in args.models.split(","):
            continue
        model = random_model(config)
        save_model(model, work / name, extra={"tokenizer": CharTokenizer(CHARS).to_json()})
        export(work / name, work / f"{name}-hf")
        out.append((name, model, work / f"{name}-hf"))
    for i, ckpt in enumerate(args.ckpt):
        _, model, _ = load_checkpoint(ckpt)
        export(Path(ckpt), work / f"ckpt{i}-hf")
        out.append((ckpt, model.eval(), work / f"ckpt{i}-hf"))
    return out


def table(rows: list[dict[str, object]]) -> list[str]:
    lines = ["| model | TL dtype | max abs diff q | k | v | largest q score | attngpt default (every RoPE distance)"
             " vs TL, q/k |", "|---|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        default = f"{r['default']:.3g}" if "default" in r else "same (no RoPE)"
        lines.append(f"| {r['model']} | {r['dtype']} | {r['q']:.2e} | {r['k']:.2e} | {r['v']:.2e} | "
                     f"{r['max score']:.4f} | {default} |")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="llama-mha,llama-gqa,gpt2", help="random shapes, comma-separated")
    parser.add_argument("--ckpt", action="append", default=[], help="also a trained checkpoint or run out_dir")
    parser.add_argument("--dtypes", default="float32,float64", help="TransformerLens's dtypes, comma-separated")
    parser.add_argument("--tolerance", type=float, default=1e-5, help="the largest max |attngpt - TL| accepted")
    _report.save_flags(parser, quick="2 layers x 16 wide, float32 only (seconds)")
    args = parser.parse_args(argv)
    try:
        import transformer_lens.model_bridge  # noqa: F401
    except ImportError:
        print(f"{SCRIPT}: transformer_lens is not installed, skipped (install it in its own venv: this script's "
              f"header)")
        return 0
    dtypes = ["float32"] if args.quick else args.dtypes.split(",")
    with tempfile.TemporaryDirectory() as tmp:
        rows = [row for name, model, hf in models(args, Path(tmp)) for row in compare(name, model, hf, dtypes)]
    lines = table(rows)
    print("\n".join(lines))
    worst = max(max(r[kind] for kind in COMPOSITION_KINDS) for r in rows)
    verdict = f"worst max |attngpt - TL| {worst:.2e}: {'within' if worst <= args.tolerance else 'OVER'} " \
              f"the tolerance {args.tolerance:g}"
    print(verdict)
    versions = [f"transformer-lens {importlib.metadata.version('transformer-lens')}",
                f"transformers {importlib.metadata.version('transformers')}"]
    machine_line = _report.machine(extra=[_report.cpu_bf16_support(), *versions])
    notes = ["", verdict, "", "attngpt: `composition_scores(model, group_kv=False, rope_offsets=(0,))`; TL: "
             "`TransformerBridge.boot_transformers(hf, dtype=...)`, `enable_compatibility_mode()`, "
             "`all_composition_scores(\"Q\"|\"K\"|\"V\")`. The last column is attngpt's default (every RoPE "
             "distance side by side) against TL's unrotated score: a different quantity, not a disagreement. "
             "The ~1e-9 left in float64: TransformerLens's weight processing folds the norms in float32 whatever "
             "the model's dtype (its process_weights upcasts to float32), so its folded weights are a float32 "
             "rounding of attngpt's float64 ones (with gains of 1, nothing to fold, the float64 difference is "
             "~3e-16)."]
    _report.save(args, "Composition scores vs TransformerLens", machine_line, SCRIPT, "", *lines, *notes)
    return 0 if worst <= args.tolerance else 1


if __name__ == "__main__":
    sys.exit(main())
