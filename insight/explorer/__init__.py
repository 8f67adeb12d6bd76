"""The attention explorer: one self-contained HTML file that shows what every head attends to.

    html = explorer_html(model.attention_internals(idx), tokens)    # or write_explorer(path, ...)
    html = explorer_html(internals, tokens, options=ExplorerOptions(title="step 100", window=128),
                         scores=HeadScores(*prompt_head_scores(model, idx, tokenizer)))  # insight.dump's

Views (docs/attention.md, "The explorer", describes each): the head view, with value-weighted attention
||alpha_ij v_j W_O^h|| as a toggle; the text view (text_view.js), the first one when the prompt has more than
TEXT_VIEW_TOKENS tokens or is char-level; the model view; the step-by-step arithmetic of one (layer, head, query)
with the model's own q, k and v; and the Statistics tab (stats_view.js), the per-head statistics with what each
head does when the caller passes `scores` (HeadScores of insight/dump.prompt_head_scores: prev_token,
duplicate_token, induction, ablation_dloss of every layer) and a role label by insight.roles.role_label; the
Circuit tab (circuit_view.js) when those scores carry a circuit (CircuitScores of insight/dump.prompt_circuit_scores):
every head a node, its strongest Q/K/V inputs as edges, and a click on a head shows what it reads, writes and
promotes, with a line of what it does (insight/describe.py).

The file needs no network: its JS (JS_FILES) and CSS (explorer.css) are inlined into template.html,
its data is a JSON header plus two base64 gzip blobs (pack.py) that the browser's DecompressionStream
unpacks, and a Content-Security-Policy forbids any fetch. Inputs longer than `window` tokens are cut
to their first `window` (causal attention never looks ahead, so those rows are exactly the model's).
The weights of every head are always stored (8 bits each); float32 q/k/v for the step-by-step view
fill what is left of `max_bytes` (pack.py says in which order).
"""
from __future__ import annotations

import base64
import json
import math
import re
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Sequence

import numpy as np

from common.writes import write_file
from insight.circuit_dump import PATH_NAMES, TOP_SOURCES, top_sources
from insight.circuits import COMPOSITION_KINDS
from insight.describe import EDGE_Z_MIN, head_descriptions
from insight.explorer.pack import Blob, choose_detail, detail_order, quantise_rows
from insight.heatmap import token_label
from insight.roles import ROLE_LABELS, ROLE_THRESHOLDS, role_label
from insight.stats import STAT_NAMES, head_stats
from insight.value_weighted import internals_value_norms
from model.gpt import AttentionInternals

WINDOW = 256  # tokens shown at most: 12 layers x 12 heads x 256 tokens stays under 10 MB
MAX_BYTES = 10_000_000  # the file's size budget; q/k/v of heads are left out beyond it (the weights never are)
_SLOT = re.compile(r"\{\{(TITLE|CSS|JS|META|DATA|DETAIL)\}\}")
JS_FILES = ("text_view.js", "stats_view.js", "circuit_view.js", "explorer.js")  # inlined in this order: explorer.js
# uses the others
HEAD_SCORE_NAMES = ("prev_token", "duplicate_token", "induction", "ablation_dloss")  # head_scores' keys
ROLE_ORDER = ("induction", "prev_token", "duplicate_token")  # the order role_label tries them in, for the page's legend
TEXT_VIEW_TOKENS = 40  # more tokens than this (or a char-level prompt): the page opens on the text view


def _asset(name: str) -> str:
    return resources.files(__package__).joinpath(name).read_text(encoding="utf-8")


def _json_for_script(obj) -> str:
    """JSON that is safe inside <script>: no '<' (so no '</script>'), NaN as null."""
    return json.dumps(obj, ensure_ascii=False, allow_nan=False).replace("<", "\\u003c")


def _finite_or_none(values: np.ndarray) -> list:
    return [float(x) if math.isfinite(x) else None for x in np.asarray(values, dtype=np.float64)]


def _render(meta: dict, data: bytes, detail: bytes) -> str:
    js = "\n".join(_asset(name) for name in JS_FILES)
    if "</script" in js.lower():
        raise ValueError(f"{', '.join(JS_FILES)} must not contain '</script'")
    title = (meta["title"].replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;"))
    slots = {"TITLE": title, "CSS": _asset("explorer.css"), "JS": js, "META": _json_for_script(meta),
             "DATA": base64.b64encode(data).decode("ascii"), "DETAIL": base64.b64encode(detail).decode("ascii")}
    return _SLOT.sub(lambda m: slots[m.group(1)], _asset("template.html"))  # one pass: inserted text is never re-read


@dataclass(frozen=True)
class ExplorerOptions:
    """How the page is made: its title and header line (info, e.g. the step), the model's depth for the
    header (n_layer; default: the largest layer + 1), how many tokens it shows (window), its size budget
    (max_bytes) and the batch item drawn; quantized, for a quantized model: its description (model/quantize.py),
    which makes the header line say the maps come from int8 weights. Frozen: one default instance serves every
    call."""
    title: str = "attngpt attention"
    info: str = ""
    quantized: str = ""
    n_layer: int | None = None
    window: int = WINDOW
    max_bytes: int = MAX_BYTES
    item: int = 0


@dataclass(frozen=True)
class CircuitScores:
    """The circuit between the heads, for the Circuit tab: arrays of insight.circuit_dump.prompt_circuit_arrays
    (its keys; every layer of the model), their note, and token_texts {token id: text} for the ids its OV arrays
    name (an id without one is shown as #id). insight.dump.prompt_circuit_scores makes it."""
    arrays: dict[str, np.ndarray]
    note: str = ""
    token_texts: dict[int, str] = field(default_factory=dict)


@dataclass(frozen=True)
class HeadScores:
    """What each head does, for the Statistics tab: values {name: (n_layer, n_head) array} for names of
    HEAD_SCORE_NAMES (any subset; row l is layer l, every layer of the model, NaN allowed) and a note saying
    what they were measured on. One record, since the note only means something beside its scores;
    insight.dump.prompt_head_scores returns exactly these two. circuit, when given, adds the Circuit tab."""
    values: dict[str, np.ndarray]
    note: str = ""
    circuit: CircuitScores | None = None


def _scores_meta(head_scores: dict[str, np.ndarray] | None, n_head: int) -> dict:
    """head_scores {name: (n_layer, n_head)} -> the page's {"scores": {name: [[...] per layer]}, "roles":
    [[label per head] per layer]} (NaN as null), checked: known names, one shape for all."""
    if not head_scores:
        return {"scores": {}, "roles": []}
    unknown = sorted(set(head_scores) - set(HEAD_SCORE_NAMES))
    if unknown:
        raise ValueError(f"head_scores: unknown score(s) {unknown}; the page shows {list(HEAD_SCORE_NAMES)}")
    arrays = {name: np.asarray(head_scores[name], dtype=np.float64) for name in HEAD_SCORE_NAMES if name in head_scores}
    shapes = {a.shape for a in arrays.values()}
    if len(shapes) != 1 or len(next(iter(shapes))) != 2 or next(iter(shapes))[1] != n_head:
        raise ValueError(f"head_scores must all be (n_layer, {n_head}) arrays, got shapes "
                         f"{ {name: a.shape for name, a in arrays.items()} }")
    n_rows = next(iter(shapes))[0]
    nan = np.full((n_rows, n_head), np.nan)
    prev, dup, ind = (arrays.get(name, nan) for name in ("prev_token", "duplicate_token", "induction"))
    roles = [[role_label(prev[l, h], dup[l, h], ind[l, h]) for h in range(n_head)] for l in range(n_rows)]
    return {"scores": {name: [_finite_or_none(row) for row in a] for name, a in arrays.items()}, "roles": roles}


def _number(x) -> float | None:
    """x to 5 significant digits (float32's repr in JSON is twice as long and says no more), NaN and inf as null."""
    x = float(x)
    return float(f"{x:.5g}") if math.isfinite(x) else None


def _circuit_meta(scores: HeadScores | None, n_head: int) -> dict | None:
    """The page's "circuit" (circuit_view.js reads it), or None without one: per target head and kind its
    TOP_SOURCES edges of largest z (the ones path-ablated), each [kind, la, a, lb, b, z, score, Δloss,
    Δprev_token, Δduplicate_token, Δinduction] (NaN, +inf as null); per head its direct logit, description and
    OV tokens [[attended text, share, [[promoted text, logit], ...]], ...]."""
    if scores is None or scores.circuit is None:
        return None
    arrays, texts = scores.circuit.arrays, scores.circuit.token_texts
    z = np.asarray(arrays["circuit_z"], dtype=np.float64)  # (3, L, H, L, H)
    if z.ndim != 5 or z.shape[2] != n_head or z.shape[4] != n_head:
        raise ValueError(f"circuit_z must be (3, n_layer, {n_head}, n_layer, {n_head}), got {z.shape}")
    n_layer = z.shape[1]
    raw = arrays["circuit_composition"]
    path = [arrays[f"circuit_path_{name}"] for name in PATH_NAMES]
    edges = []
    for k in range(len(COMPOSITION_KINDS)):
        for lb in range(1, n_layer):
            for b in range(n_head):
                for la, a in top_sources(z[k], (lb, b)):
                    at = (k, la, a, lb, b)
                    edges.append([k, la, a, lb, b, _number(z[at]), _number(raw[at]), *(_number(p[at]) for p in path)])
    text = lambda i: token_label(texts[int(i)], max_len=16) if int(i) in texts else f"#{int(i)}"  # noqa: E731
    ov = [[[[text(arrays["head_ov_token"][l, h, a]), _number(arrays["head_ov_attention"][l, h, a]),
             [[text(v), _number(x)] for v, x in zip(arrays["head_ov_promoted"][l, h, a],
                                                    arrays["head_ov_promoted_logit"][l, h, a]) if v >= 0]]
            for a in range(arrays["head_ov_token"].shape[2]) if arrays["head_ov_token"][l, h, a] >= 0]
           for h in range(n_head)] for l in range(n_layer)]
    return {"n_layer": n_layer, "kinds": list(COMPOSITION_KINDS), "top_sources": TOP_SOURCES, "edge_z_min": EDGE_Z_MIN,
            "edges": edges, "direct_logit": [_finite_or_none(row) for row in arrays["head_direct_logit"]],
            "descriptions": head_descriptions(scores.values, arrays), "ov": ov, "note": scores.circuit.note}


def explorer_html(internals: dict[int, AttentionInternals], tokens: Sequence[str],
                  selected: dict[int, list[int]] | None = None, *, options: ExplorerOptions = ExplorerOptions(),
                  scores: HeadScores | None = None) -> str:
    """The explorer page for GPT.attention_internals(idx, layers) (batch item `options.item`) over `tokens`
    (one string per position). selected: {layer: heads} shown first (default all heads); options: the
    page's title, header, window and size budget (ExplorerOptions). scores, when given, are shown in the
    Statistics tab beside the maps' statistics with a role label per head, and their note with them."""
    item = options.item
    head_scores, scores_note = (None, "") if scores is None else (scores.values, scores.note)
    layers = sorted(internals)
    if not layers:
        raise ValueError("no layers to show")
    first = internals[layers[0]]
    n_head, n_kv_head, T, head_dim = first.q.shape[1], first.k.shape[1], first.q.shape[2], first.q.shape[3]
    if len(tokens) != T:
        raise ValueError(f"{len(tokens)} tokens for T={T} positions")
    selected = {layer: list(range(n_head)) for layer in layers} if selected is None else selected
    if sorted(selected) != layers or not all(selected[layer] for layer in layers):
        raise ValueError(f"selected must name some heads of each layer {layers}, got {selected}")
    W = min(T, options.window)

    data = Blob()
    stats = {}
    for layer in layers:
        weights = internals[layer].weights[item, :, :W, :W].detach().float().cpu().numpy()  # (n_head, W, W)
        codes, row_max = quantise_rows(weights)
        data.add(f"attn.{layer}", codes)
        data.add(f"scale.{layer}", row_max)
        norms = internals_value_norms(internals[layer])[item, :, :W]  # (n_head, W): ||v_j W_O^h||
        data.add(f"vnorm.{layer}", norms.detach().cpu().numpy().astype(np.float32))
        stats[str(layer)] = {name: _finite_or_none(v) for name, v in head_stats(weights).items()}

    char_level = W > 1 and all(len(t) == 1 for t in tokens[:W])
    circuit = _circuit_meta(scores, n_head)  # before `scores` names the page's form of them
    scores = _scores_meta(head_scores, n_head)
    info = " · ".join(filter(None, [options.info, "from int8-quantized weights" if options.quantized else ""]))
    meta = {"format": 1, "title": options.title, "info": info,
            "n_layer": options.n_layer or max(layers[-1] + 1, len(scores["roles"])),
            "layers": layers, "n_head": n_head, "n_kv_head": n_kv_head, "head_dim": head_dim, "n_tokens": T,
            "window": W, "labels": [token_label(t, max_len=16) for t in tokens[:W]],
            "texts": [str(t) for t in tokens[:W]], "char_level": char_level,
            "first_view": "text" if W > TEXT_VIEW_TOKENS or char_level else "head",
            "selected": {str(layer): [int(h) for h in selected[layer]] for layer in layers},
            "stat_names": list(STAT_NAMES), "stats": stats, "arrays": data.specs,
            "score_names": [name for name in HEAD_SCORE_NAMES if name in scores["scores"]], **scores,
            "scores_note": scores_note, "role_rules": [[ROLE_LABELS[name], name, ROLE_THRESHOLDS[name]] for name in ROLE_ORDER],
            "quantisation": "8-bit per row: weight = code / 255 * row max", "detail_heads": {}, "detail_arrays": {},
            "circuit": circuit}
    data_gz = data.gzipped()

    # q/k/v in float32 in what the weights leave of the budget: base64 makes 4 bytes of 3, gzip
    # hardly shrinks float32; each array adds ~50 bytes of JSON. Checked after building, shed if over.
    head_bytes = W * head_dim * 4
    spare = options.max_bytes - len(_render(meta, data_gz, b"").encode("utf-8")) - 256
    order = detail_order(layers, selected, n_head)
    chosen = choose_detail(order, n_head // n_kv_head, head_bytes, int(spare * 3 / 4 / 1.002) - 120 * len(order))
    while True:
        detail = Blob()
        for layer, heads in sorted(chosen.items()):
            it = internals[layer]
            for h in heads:
                detail.add(f"q.{layer}.{h}", it.q[item, h, :W].detach().float().cpu().numpy())
            for g in sorted({h // (n_head // n_kv_head) for h in heads}):
                detail.add(f"k.{layer}.{g}", it.k[item, g, :W].detach().float().cpu().numpy())
                detail.add(f"v.{layer}.{g}", it.v[item, g, :W].detach().float().cpu().numpy())
        meta["detail_heads"] = {str(layer): heads for layer, heads in sorted(chosen.items())}
        meta["detail_arrays"] = detail.specs
        html = _render(meta, data_gz, detail.gzipped())
        if len(html.encode("utf-8")) <= options.max_bytes or not chosen:
            return html
        last = max(chosen)  # over budget (rare: the estimate is generous): drop the last head kept
        chosen[last].pop()
        if not chosen[last]:
            del chosen[last]


def write_explorer(path: str | Path, internals: dict[int, AttentionInternals], tokens: Sequence[str],
                   selected: dict[int, list[int]] | None = None, *, options: ExplorerOptions = ExplorerOptions(),
                   scores: HeadScores | None = None) -> Path:
    """explorer_html(...) written to path (UTF-8); returns the path."""
    write_file(path, explorer_html(internals, tokens, selected, options=options, scores=scores))
    return Path(path)
