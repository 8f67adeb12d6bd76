"""The attention explorer at GPT-2 small's shape: file size and time to interactive in headless Chromium.

Why: the explorer must stay usable for 12 layers x 12 heads x 256 tokens (GPT-2 small on a paragraph): a file of
at most 10 MB, interactive within 2 s of opening. Reported here, never asserted.

Model: GPT-2 small's shape (vocab 50304, learned positions, LayerNorm, GELU, biases), fp32, random weights, over
256 GPT-2 tokens of tinyshakespeare (random ids without the text or the tokenizer files). Two weight draws, as
the size depends on how compressible the maps are: init, GPT-2's (std 0.02), near-uniform attention, the most
compressible case; sharp, q and k projections x`--sharpen` (default 3), peaked, varied rows like a trained
model's. The bound for maps that would not compress at all is printed too (8-bit weights, base64).

Timings (`--reps` fresh page loads each, median):
  - interactive: performance.now() when the page has decoded the weights and drawn the head view, the
    step-by-step panel and the statistics, its handlers in place (window.attnExplorer.readyMs, from the start
    of navigation: reading and parsing the file included);
  - q/k/v decoded: when the step-by-step view has its float32 numbers (the page is usable before);
  - model view drawn: when the last of the 144 small maps is drawn (in slices after the page is ready);
  - wall: from driver.get() to seeing the page ready, as the test driver sees it;
  - interactions, inside the page: clicking the last token with all 12 heads on (3,084 lines), switching
    layer, toggling value-weighted attention, opening a head in the model view.

    python benchmarks/explorer_size.py [--reps 5] [--tokens 256] [--sharpen 3] [--keep DIR] [--quick] [--no-save]
"""
from __future__ import annotations

import argparse
import json
import re
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import torch

import _report
from insight.explorer import MAX_BYTES, ExplorerOptions, explorer_html
from model import GPT, ModelConfig

TEXT_SOURCES = [_report.REPO / "data" / "cache" / "tinyshakespeare" / "input.txt",
                _report.REPO.parent / "shared" / "data" / "tinyshakespeare" / "input.txt"]


def gpt2_small(quick: bool) -> ModelConfig:
    block, layers, width = (256, 4, 256) if quick else (1024, 12, 768)
    return ModelConfig(vocab_size=50304, block_size=block, n_layer=layers, n_head=layers, d_model=width,
                       pos="learned", norm="layernorm", mlp="gelu", bias=True)


def paragraph(n_tokens: int) -> tuple[list[int], list[str], str]:
    """n_tokens GPT-2 tokens of tinyshakespeare, with their strings; random ids when unavailable."""
    try:
        from data.tokenizer import TiktokenTokenizer
        tok = TiktokenTokenizer("gpt2")
        text = next(p for p in TEXT_SOURCES if p.is_file()).read_text(encoding="utf-8")[: n_tokens * 8]
        ids = tok.encode(text)[:n_tokens]
        if len(ids) == n_tokens:
            return ids, tok.token_strings(ids), f"the first {n_tokens} GPT-2 tokens of tinyshakespeare"
    except Exception as e:  # no tokenizer files, no text: the size hardly depends on which tokens
        print(f"(no text: {e}; random token ids)")
    ids = torch.randint(0, 50257, (n_tokens,), generator=torch.Generator().manual_seed(0)).tolist()
    return ids, [f"t{i}" for i in ids], f"{n_tokens} random token ids"


def start_browser():
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    chromium = next((p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome")) if p), None)
    driver_path = shutil.which("chromedriver")
    if chromium is None or driver_path is None:
        raise SystemExit("explorer_size.py needs chromium and chromedriver (Debian: apt-get install chromium chromium-driver)")
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1400,1000"):
        options.add_argument(arg)
    return webdriver.Chrome(service=Service(driver_path), options=options), chromium


INTERACT = """
const t = {}, api = window.attnExplorer, H = api.meta.n_head, W = api.meta.window, L = api.meta.layers;
let t0 = performance.now();
document.getElementById('heads-all').click();
document.getElementById('q-tok-' + (W - 1)).click();
t.click_last_token_all_heads = performance.now() - t0;
t.lines = document.querySelectorAll('#lines line').length;
const sel = document.getElementById('layer-select');
t0 = performance.now();
sel.value = L[L.length - 1]; sel.dispatchEvent(new Event('change'));
t.switch_layer = performance.now() - t0;
t0 = performance.now();
document.getElementById('value-weighted').click();
t.value_weighted_toggle = performance.now() - t0;
t0 = performance.now();
document.getElementById('thumb-' + L[0] + '-' + (H - 1)).click();
t.open_head = performance.now() - t0;
return t;
"""


def measure(driver, path: Path, reps: int) -> dict[str, float]:
    runs: dict[str, list[float]] = {}
    for _ in range(reps):
        t0 = time.perf_counter()
        driver.get(path.resolve().as_uri())
        while not driver.execute_script("return document.documentElement.dataset.ready === '1'"):
            if driver.execute_script("return window.attnExplorer && window.attnExplorer.error || null"):
                raise SystemExit(driver.execute_script("return window.attnExplorer.error"))
            time.sleep(0.005)
        wall = (time.perf_counter() - t0) * 1000
        while not driver.execute_script("return document.documentElement.dataset.detail === '1' && "
                                        "!!window.attnExplorer.modelViewMs"):
            time.sleep(0.005)
        got = driver.execute_script("const a = window.attnExplorer; return {interactive_ms: a.readyMs, "
                                    "qkv_decoded_ms: a.detailMs, model_view_ms: a.modelViewMs}") | {"wall_ms": wall}
        for name, value in driver.execute_script(INTERACT).items():
            got[name if name == "lines" else f"{name}_ms"] = value
        for name, value in got.items():
            runs.setdefault(name, []).append(float(value))
    return {name: statistics.median(values) for name, values in runs.items()}


def main() -> None:
    parser = argparse.ArgumentParser(prog="explorer_size", description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=5, help="page loads per file (median)")
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--sharpen", type=float, default=3.0, help="q/k weight scale of the 'sharp' draw")
    parser.add_argument("--keep", type=Path, help="also copy the generated pages into this folder")
    _report.save_flags(parser, quick="a smaller shape, 2 loads; saves nothing unless --save")
    args = parser.parse_args()
    reps = 2 if args.quick else args.reps
    torch.manual_seed(0)
    cfg = gpt2_small(args.quick)
    ids, tokens, text_note = paragraph(min(args.tokens, cfg.block_size))
    model = GPT(cfg).eval()
    idx = torch.tensor([ids])
    driver, chromium = start_browser()
    version = driver.capabilities.get("browserVersion", "?")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for draw in ("init", "sharp"):
            if draw == "sharp":
                with torch.no_grad():
                    for block in model.blocks:
                        d = cfg.n_head * cfg.head_dim
                        block.attn.qkv_proj.weight[: 2 * d] *= args.sharpen  # q and k rows (MHA: n_kv_head = n_head)
            internals = model.attention_internals(idx)
            options = ExplorerOptions(info=f"{draw} weights", n_layer=cfg.n_layer)
            t_build, html = _report.timed(lambda: explorer_html(internals, tokens, options=options))
            path = Path(tmp) / f"explorer_{draw}.html"
            path.write_text(html, encoding="utf-8")
            if args.keep:
                args.keep.mkdir(parents=True, exist_ok=True)
                shutil.copy(path, args.keep / path.name)
            meta = json.loads(re.search(r'id="attn-meta">(.*?)</script>', html, re.S).group(1))
            data_b64 = len(re.search(r'id="attn-data">(.*?)</script>', html, re.S).group(1))
            detail_b64 = len(re.search(r'id="attn-detail">(.*?)</script>', html, re.S).group(1))
            kept = sum(len(h) for h in meta["detail_heads"].values())
            entropy = sum(sum(x for x in meta["stats"][str(L)]["entropy"] if x is not None)
                          for L in meta["layers"]) / (cfg.n_layer * cfg.n_head)
            timing = measure(driver, path, reps)
            rows.append(dict(draw=draw, size=path.stat().st_size, weights=data_b64, detail=detail_b64, kept=kept,
                             entropy=entropy, build=t_build, **timing))
    driver.quit()

    W, n_heads = min(args.tokens, cfg.block_size), cfg.n_layer * cfg.n_head
    bound = (n_heads * W * (W + 1) // 2 + 2 * n_heads * W * 4) * 4 / 3
    shape = f"{cfg.n_layer} layers x {cfg.n_head} heads x {W} tokens, head_dim {cfg.head_dim}"
    table = ["| weights | mean entropy | file MB | weights (base64 gzip) MB | q/k/v MB | heads with q/k/v | "
             "interactive ms | q/k/v decoded ms | model view drawn ms | wall ms | build s |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    inter = ["| weights | click last token, all heads (lines) ms | switch layer ms | value-weighted toggle ms | open a head ms |",
             "|---|---:|---:|---:|---:|"]
    for r in rows:
        table.append(f"| {r['draw']} | {r['entropy']:.2f} | {r['size'] / 1e6:.2f} | {r['weights'] / 1e6:.2f} | "
                     f"{r['detail'] / 1e6:.2f} | {r['kept']} of {n_heads} | {r['interactive_ms']:.0f} | "
                     f"{r['qkv_decoded_ms']:.0f} | {r['model_view_ms']:.0f} | {r['wall_ms']:.0f} | {r['build']:.2f} |")
        inter.append(f"| {r['draw']} | {r['click_last_token_all_heads_ms']:.0f} ({r['lines']:.0f}) | "
                     f"{r['switch_layer_ms']:.0f} | {r['value_weighted_toggle_ms']:.0f} | {r['open_head_ms']:.0f} |")
    notes = [f"- Shape: {shape}; {text_note}; budget {MAX_BYTES / 1e6:.0f} MB (insight/explorer MAX_BYTES).",
             f"- Weights that would not compress at all: {bound / 1e6:.2f} MB (8 bits each + two float32 per row, base64); "
             f"the rest of the budget holds float32 q/k/v, the selected heads first.",
             f"- Timings: median of {reps} page loads in headless {chromium} {version}; 'interactive' = performance.now() "
             f"when the head view, step-by-step panel and statistics are drawn, from the start of navigation (file "
             f"reading and parsing included); 'wall' = driver.get() until the page reports ready."]
    print("\n".join([*table, "", *inter, "", *notes]))
    _report.save(args, "Attention explorer: file size and time to interactive",
                 _report.machine(versions=["selenium"], torch_threads=True), "explorer_size.py", *notes, "", *table,
                 "", *inter)


if __name__ == "__main__":
    main()
