"""Attention over a prompt, written to disk (sample.py --dump-attn): `attn.npz`, a heatmap per layer and
`attention.html`, the interactive explorer (insight/explorer/).

attn.npz holds, for each dumped layer L (T = the prompt's tokens):
    layer_L             (n_head, T, T) float32  the attention weights alpha_ij (rows sum to 1, future 0)
    heads_L             (k,) int64              the selected heads (the PNG draws these; every head is stored)
    value_norm_L        (n_head, T) float32     ||v_j W_O^h|| (insight/value_weighted.py says why)
    value_weighted_L    (n_head, T, T) float32  alpha_ij * ||v_j W_O^h||: how much key j moves query i's output
and `tokens` (each token's text), `token_ids` (exact ids). The value arrays are written when the dump
is made from GPT.attention_internals (`dump_internals`, what sample.py does). A dump of a quantized model
(sample.py --quantize) also holds `quantized`, a 0-d str: model.quantize's description of what was quantized;
every map and score then comes from the int8 weights, and the explorer's header line says so.

sample.py also writes what each head does (`prompt_head_scores`), for EVERY layer of the model whatever
--dump-attn selects, each (n_layer, n_head) float32 (insight/roles.py, insight/ablation.py define them):
    head_prev_token       mean alpha_{i,i-1} over the prompt's queries i >= 1
    head_duplicate_token  the two scores of insight/roles.py on its role probe (ROLE_BATCH sequences, seeded:
    head_induction        the same probe for every dump, so the scores of two models compare)
    head_ablation_dloss   the prompt's mean next-token loss (nats) with the head's output zeroed before
                          out_proj, minus the intact model's: > 0 = the model needs the head on this prompt
A 1-token prompt has no next token and no previous one: head_prev_token and head_ablation_dloss are NaN
(sample.py says so). The explorer's Statistics tab shows these beside the statistics of the maps, with a
role label per head (insight.roles.role_label, thresholds ROLE_THRESHOLDS).

And the circuit between the heads (`prompt_circuit_scores`: insight/circuit_dump.py, from insight/circuits.py),
also over every layer. Edge arrays are (3, n_layer, n_head, n_layer, n_head) float32 indexed [kind, source layer,
source head, target layer, target head], kind in COMPOSITION_KINDS order (q, k, v), NaN wherever the source's
layer is not before the target's; a kv head's K and V edges stand on each query head of its group:
    circuit_composition   the composition score ‖W_OV^A W^B‖ / (‖W_OV^A‖ ‖W^B‖), from the weights
    circuit_z             its z against a random rotation of the residual stream (composition_zscores; +inf where
                          a matrix is isotropic)
    circuit_path_dloss    path ablation (zero) of the edge on the prompt: the loss's change, nats; only for each
                          target's TOP_SOURCES (3) sources of largest z per kind, NaN for every other edge
    circuit_path_prev_token, circuit_path_duplicate_token, circuit_path_induction
                          the same ablations' change of the target's role score (prev_token on the prompt, the
                          other two on the role probe); for a V edge 0 (a value path never moves the maps)
Per head, (n_layer, n_head) unless said:
    head_direct_logit     direct logit attribution relative to the mean logit (the correct token's logit minus the
                          mean logit, what the softmax sees), mean over the prompt's predicted positions
    head_ov_token         (n_layer, n_head, 3) int64: the prompt's token ids the head attends to most (-1: fewer)
    head_ov_attention     (n_layer, n_head, 3) float32: each one's share of the head's attention
    head_ov_promoted      (n_layer, n_head, 3, 5) int64: the tokens each one's write promotes most (ov_promoted_tokens)
    head_ov_promoted_logit  (n_layer, n_head, 3, 5) float32: by how much (direct logit per unit of attention)
    head_description      (n_layer, n_head) str: one line of what the head does (insight/describe.py's rules)
A 1-token prompt: circuit_path_* and head_direct_logit are NaN (no next token; the note says so); the
composition arrays come from the weights and the OV tokens from the one token, and are there.
"""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np
import torch

from common.writes import write_file
from insight.ablation import ablation_dloss
from insight.circuit_dump import prompt_circuit_arrays
from insight.describe import head_descriptions
from insight.explorer import HEAD_SCORE_NAMES, CircuitScores, ExplorerOptions, HeadScores, write_explorer
from insight.heatmap import draw_heatmap
from insight.roles import prev_token_score, probe_length, probe_role_scores, role_probe
from insight.value_weighted import internals_value_norms
from model.gpt import AttentionInternals

ROLE_BATCH = 8  # role-probe sequences, as training's attn.role_batch default
ROLE_SEED = 0  # the probe is the same for every dump: scores of two models compare


def parse_layer_heads(spec: str, n_layer: int, n_head: int) -> dict[int, list[int]]:
    """'all' | '0,2' (whole layers) | '1:3,1:0' (layer:head pairs) -> {layer: [heads]}, checked against the
    model. Raises ValueError naming the bad part and the valid range."""
    spec = spec.strip()
    if spec == "all":
        return {layer: list(range(n_head)) for layer in range(n_layer)}
    selected: dict[int, list[int]] = {}
    for part in filter(None, (p.strip() for p in spec.split(","))):
        layer_text, _, head_text = part.partition(":")
        try:
            layer = int(layer_text)
            head = int(head_text) if head_text else None
        except ValueError:
            raise ValueError(f"'{part}' is not a layer or layer:head: use all, 0,2 or 1:3") from None
        if not 0 <= layer < n_layer:
            raise ValueError(f"layer {layer} is out of range: the model has layers 0..{n_layer - 1}")
        if head is not None and not 0 <= head < n_head:
            raise ValueError(f"head {head} is out of range: each layer has heads 0..{n_head - 1}")
        heads = selected.setdefault(layer, [])
        for h in ([head] if head is not None else range(n_head)):
            if h not in heads:
                heads.append(h)
    if not selected:
        raise ValueError(f"'{spec}' selects no layer: use all, 0,2 or 1:3")
    return selected


def dump_probe(model, tokenizer, device: torch.device, role_batch: int = ROLE_BATCH,
               seed: int = ROLE_SEED) -> tuple[torch.Tensor | None, str]:
    """The role probe every dump measures on (insight.roles.role_probe, on `device`) and a note saying what it
    is; None, and a note saying why, when block_size leaves no room for one."""
    R = probe_length(model.config.block_size)
    if R < 1:
        return None, (f"duplicate_token and induction are NaN: block_size {model.config.block_size} leaves no room "
                      f"for the role probe (a start token and two copies)")
    probe = role_probe(tokenizer.ordinary_ids(), tokenizer.start_id, model.config.block_size, batch=role_batch,
                       seed=seed).to(device)
    return probe, (f"duplicate_token and induction on the role probe ({role_batch} × a start token, {R} random "
                   f"tokens and the same {R} again, seed {seed})")


@torch.no_grad()
def prompt_head_scores(model, idx: torch.Tensor, tokenizer, role_batch: int = ROLE_BATCH,
                       seed: int = ROLE_SEED) -> tuple[dict[str, np.ndarray], str]:
    """What each head of every layer does (module doc): ({name: (n_layer, n_head) float32} for every name
    of HEAD_SCORE_NAMES, a note that says what they were measured on and why any is NaN). idx (1, T): the
    prompt; tokenizer gives the role probe's ordinary ids and start id. Eval mode, from-scratch path; the
    model's mode is left as it was."""
    T = idx.shape[1]
    n_layer, n_head = model.config.n_layer, model.config.n_head
    nan = np.full((n_layer, n_head), np.nan)
    probe, probe_note = dump_probe(model, tokenizer, idx.device, role_batch, seed)
    roles = probe_role_scores(model, probe) if probe is not None else {"duplicate_token": nan, "induction": nan}
    if T >= 2:  # a 1-token prompt has no previous token and no next one
        maps = model.attention_maps(idx)  # {layer: (1, n_head, T, T)}, eval mode
        roles["prev_token"] = np.stack([prev_token_score(maps[layer]) for layer in range(n_layer)])
        dloss = ablation_dloss(model, idx, mode="zero")
        prompt_note = f"prev_token and ablation Δloss over the prompt's {T} tokens"
    else:
        roles["prev_token"] = dloss = nan
        prompt_note = ("prev_token and ablation Δloss are NaN: a 1-token prompt has no previous token and no "
                       "next token to predict (give a longer prompt)")
    note = f"{prompt_note}; {probe_note}; ablation: the head's output zeroed before out_proj"
    scores = {**roles, "ablation_dloss": dloss}
    return {name: np.asarray(scores[name], dtype=np.float32) for name in HEAD_SCORE_NAMES}, note


def prompt_circuit_scores(model, idx: torch.Tensor, tokenizer) -> CircuitScores:
    """The circuit arrays of the prompt idx (1, T) (insight.circuit_dump.prompt_circuit_arrays, on dump_probe's
    role probe), their note, and the text of every token id they name (the OV-promoted tokens), for the page."""
    probe, _ = dump_probe(model, tokenizer, idx.device)
    arrays, note = prompt_circuit_arrays(model, idx, probe)
    named = np.concatenate([arrays["head_ov_token"].ravel(), arrays["head_ov_promoted"].ravel()])
    ids = sorted(int(i) for i in np.unique(named[named >= 0]))
    return CircuitScores(arrays, note, dict(zip(ids, tokenizer.token_strings(ids))))


def dump_attention(weights_by_layer: dict[int, torch.Tensor], heads_by_layer: dict[int, list[int]],
                   tokens: Sequence[str], out_dir: str | Path,
                   token_ids: Sequence[int] | None = None,
                   value_norms: dict[int, torch.Tensor] | None = None,
                   scores: HeadScores | None = None) -> list[Path]:
    """Write `attn.npz` (its keys: module doc; `token_ids` when given, exact where a numpy string array is not,
    e.g. it drops a token's trailing NUL) and one heatmap `layer_L.png` of the selected heads per layer.
    weights_by_layer: (n_head, T, T) maps per layer, e.g. GPT.attention_maps(idx)[L][0]; value_norms, when given:
    (n_head, T) ||v_j W_O^h|| per layer (insight.value_weighted), for `value_norm_L` and `value_weighted_L`;
    scores, when given: its values {name: (n_layer, n_head)} (`prompt_head_scores`), written as `head_{name}`,
    and its circuit's arrays (`prompt_circuit_scores`) under their own names, with `head_description`."""
    arrays, written = _arrays_and_heatmaps(weights_by_layer, heads_by_layer, tokens, Path(out_dir), token_ids,
                                           value_norms, scores)
    return [write_npz(Path(out_dir), arrays), *written]


def write_npz(out_dir: Path, arrays: dict[str, np.ndarray]) -> Path:
    """`out_dir/attn.npz` holding `arrays`, written whole or not at all (common.writes.write_file)."""
    path = out_dir / "attn.npz"
    write_file(path, lambda f: np.savez(f, **arrays))
    return path


def _arrays_and_heatmaps(weights_by_layer: dict[int, torch.Tensor], heads_by_layer: dict[int, list[int]],
                         tokens: Sequence[str], out_dir: Path, token_ids: Sequence[int] | None,
                         value_norms: dict[int, torch.Tensor] | None,
                         scores: HeadScores | None) -> tuple[dict[str, np.ndarray], list[Path]]:
    """dump_attention's work but the npz's writing: (its arrays, the heatmaps written)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    arrays: dict[str, np.ndarray] = {"tokens": np.array(list(tokens), dtype=str)}
    if token_ids is not None:
        if len(token_ids) != len(tokens):
            raise ValueError(f"{len(token_ids)} token ids for {len(tokens)} tokens")
        arrays["token_ids"] = np.array(list(token_ids), dtype=np.int64)
    written = []
    for layer, heads in sorted(heads_by_layer.items()):
        w = weights_by_layer[layer].detach().float().cpu().numpy()  # (n_head, T, T)
        arrays[f"layer_{layer}"] = w
        arrays[f"heads_{layer}"] = np.array(heads, dtype=np.int64)
        if value_norms is not None:
            norms = value_norms[layer].detach().float().cpu().numpy()  # (n_head, T)
            arrays[f"value_norm_{layer}"] = norms
            arrays[f"value_weighted_{layer}"] = w * norms[:, None, :]  # (n_head, T, T)
        png = out_dir / f"layer_{layer}.png"
        draw_heatmap(w, tokens, title=f"layer {layer}", path=png, heads=heads)
        written.append(png)
    for name, values in (scores.values if scores is not None else {}).items():
        arrays[f"head_{name}"] = np.asarray(values, dtype=np.float32)
    if scores is not None and scores.circuit is not None:
        arrays.update(scores.circuit.arrays)
        arrays["head_description"] = np.array(head_descriptions(scores.values, scores.circuit.arrays), dtype=str)
    return arrays, written


def dump_internals(internals: dict[int, AttentionInternals], heads_by_layer: dict[int, list[int]],
                   tokens: Sequence[str], out_dir: str | Path, token_ids: Sequence[int] | None = None, *,
                   options: ExplorerOptions = ExplorerOptions(), scores: HeadScores | None = None) -> list[Path]:
    """What sample.py --dump-attn writes, from GPT.attention_internals(idx, layers) of one prompt (B = 1):
    `attn.npz` with the value-weighted arrays (and the head scores, when given: `prompt_head_scores`), a
    heatmap per layer and `attention.html` (the explorer made with `options`, its selected heads first; the
    scores and their note in its Statistics tab). With options.quantized (a quantized model's description)
    the npz holds it as `quantized` and the page's header line says so. Returns the paths written."""
    out_dir = Path(out_dir)
    item = options.item  # the npz and the page show the same batch item
    arrays, heatmaps = _arrays_and_heatmaps(
        {layer: it.weights[item] for layer, it in internals.items()}, heads_by_layer, tokens, out_dir, token_ids,
        {layer: internals_value_norms(it)[item] for layer, it in internals.items()}, scores)
    if options.quantized:
        arrays["quantized"] = np.array(options.quantized, dtype=str)  # 0-d: what the maps' weights were
    npz = write_npz(out_dir, arrays)
    html = write_explorer(out_dir / "attention.html", internals, tokens, heads_by_layer, options=options,
                          scores=scores)
    return [npz, *heatmaps, html]
