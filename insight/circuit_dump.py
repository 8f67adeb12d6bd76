"""The circuit arrays of one prompt, as sample.py --dump-attn writes them into attn.npz (insight/dump.py's module
doc lists the keys): insight/circuits.py's measures of every head of the model, laid out as (n_layer, n_head)
arrays beside prompt_head_scores', and, for the edges between heads, as (kind, source layer, source head, target
layer, target head) arrays with the kind axis in COMPOSITION_KINDS order (q, k, v).

Path ablation of every edge is 3 n_head² n_layer (n_layer - 1) / 2 runs of the later layers (28,512 at GPT-2
small's shape), so it is run by a rule: for each target head of layer >= 1 and each kind, its TOP_SOURCES sources
of largest composition z (NaN everywhere else; 1,188 runs at GPT-2 small's shape). Those are the edges the z
names; path ablation says whether each matters.
The values are insight.circuits.path_ablation's (the tests hold them equal); computed here with the intact runs of
the prompt and the probe shared by every target, and on the probe only the target's layer (its role scores need
no later one), which at GPT-2 small's shape is what makes the rule affordable on a CPU.
"""
from __future__ import annotations

import numpy as np
import torch

from insight.ablation import _stream_and_head_outputs, _summed_loss, _targets, eval_mode
from insight.circuits import (COMPOSITION_KINDS, _composition_terms, _final_hidden, _layer_with_one_input_replaced,
                              direct_logit_attribution, ov_promoted_tokens, ranked_sources)
from insight.roles import ROLE_NAMES, duplicate_token_score, induction_score, prev_token_score

TOP_SOURCES = 3  # sources path-ablated per target head and kind: the largest z's (module doc)
OV_ATTENDED = 3  # tokens of the prompt per head whose OV write is kept: those it attends to most
OV_PROMOTED = 5  # tokens kept per attended token: the ones its write promotes most
PATH_NAMES = ("dloss", *ROLE_NAMES)  # circuit_path_<name>: what path ablation changes (insight.circuits)


def _per_query_head(scores: dict[str, np.ndarray], n_head: int) -> np.ndarray:
    """{kind: (L, H, L, H or n_kv_head)} -> (3, L, H, L, H) float32: a kv head's K and V columns (group_kv, the
    default of composition_scores) repeated over the query heads of its group, which all read that key or value."""
    out = []
    for kind in COMPOSITION_KINDS:
        a = scores[kind]
        out.append(np.repeat(a, n_head // a.shape[-1], axis=-1))
    return np.stack(out).astype(np.float32)


def top_sources(z: np.ndarray, target: tuple[int, int], k: int = TOP_SOURCES) -> list[tuple[int, int]]:
    """The sources a dump path-ablates into `target`: insight.circuits.ranked_sources, TOP_SOURCES by default."""
    return ranked_sources(z, target, k)


class _IntactRun:
    """One input's intact pass, shared by every path ablation on it: the residual stream (n_layer + 1 of (B, T, d)),
    each layer's head outputs (B, n_head, T, head_dim), the attention maps of every layer and RoPE's angles."""

    def __init__(self, model, idx: torch.Tensor):
        self.model, self.idx = model, idx
        self.stream, self.outputs = _stream_and_head_outputs(model, idx, heads=True)
        self.maps = model.attention_maps(idx)  # {layer: (B, n_head, T, T)}
        self.rope = model.rope_freqs[:idx.shape[1]] if model.config.pos == "rope" else None  # as GPT passes it

    def write(self, layer: int, head: int) -> torch.Tensor:
        """What head (layer, head) added to the residual stream, out_h W_O^h: (B, T, d_model)."""
        hd = self.model.config.head_dim
        w_o = self.model.blocks[layer].attn.out_proj.weight[:, head * hd:(head + 1) * hd]  # (d, hd)
        return self.outputs[layer][:, head] @ w_o.T

    def ablated(self, kind: str, target: tuple[int, int], sources: list[tuple[int, int]]
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """The target's layer with each source's write removed from the target's `kind` input (zero mode, as
        path_ablation): (that layer's output (n, B, T, d), its attention maps (n, B, n_head, T, T))."""
        lb, b = target
        x = self.stream[lb]  # (B, T, d)
        removed = torch.stack([self.write(la, a) for la, a in sources])  # (n, B, T, d)
        n, (B, T, d) = len(sources), x.shape
        wide = x.expand(n, B, T, d).reshape(n * B, T, d)
        out, weights = _layer_with_one_input_replaced(self.model, lb, wide, wide - removed.reshape(n * B, T, d), kind,
                                                      b, self.rope)
        return out.view(n, B, T, d), weights.view(n, B, *weights.shape[1:])


@torch.no_grad()
def _path_arrays(model, idx: torch.Tensor, probe: torch.Tensor | None, z: np.ndarray) -> dict[str, np.ndarray]:
    """{name: (3, L, H, L, H) float32} for PATH_NAMES: path ablation (zero) of each target's top_sources by z
    (3, L, H, L, H), what insight.circuits.path_ablation(model, idx, probe, kind, target, sources) returns for them;
    NaN elsewhere. idx (1, T), T >= 2."""
    config = model.config
    L, H = config.n_layer, config.n_head
    path = {name: np.full((len(COMPOSITION_KINDS), L, H, L, H), np.nan, dtype=np.float32) for name in PATH_NAMES}
    targets = _targets(idx, None)
    count = int((targets >= 0).sum())
    with eval_mode(model):
        text = _IntactRun(model, idx)
        intact_loss = float(_summed_loss(model, model.final_norm(text.stream[-1]), targets)) / count
        on_probe = _IntactRun(model, probe) if probe is not None else None
        R = (probe.shape[1] - 1) // 2 if probe is not None else 0
        probe_scores = {"duplicate_token": lambda w: duplicate_token_score(w, R),
                        "induction": lambda w: induction_score(w, R)}
        for k, kind in enumerate(COMPOSITION_KINDS):
            for lb in range(1, L):
                for b in range(H):
                    sources = top_sources(z[k], (lb, b))
                    if not sources:  # every z NaN (a head of zero weights): nothing to ablate
                        continue
                    at = (k, *np.array(sources).T, lb, b)  # the sources' cells of this target's column
                    out, weights = text.ablated(kind, (lb, b), sources)
                    hidden = _final_hidden(model, lb, out.flatten(0, 1)).view(*out.shape[:3], -1)
                    path["dloss"][at] = [float(_summed_loss(model, h, targets)) / count - intact_loss for h in hidden]
                    intact = float(prev_token_score(text.maps[lb][:, b:b + 1])[0])
                    path["prev_token"][at] = [float(prev_token_score(w[:, b:b + 1])[0]) - intact for w in weights]
                    if on_probe is None:
                        continue
                    _, weights = on_probe.ablated(kind, (lb, b), sources)  # no later layer: the maps are all
                    for name, score in probe_scores.items():
                        intact = float(score(on_probe.maps[lb][:, b:b + 1])[0])
                        path[name][at] = [float(score(w[:, b:b + 1])[0]) - intact for w in weights]
    return path


@torch.no_grad()
def _ov_arrays(model, idx: torch.Tensor) -> dict[str, np.ndarray]:
    """ov_promoted_tokens of every head over idx (1, T): the OV_ATTENDED tokens it attends to most and the
    OV_PROMOTED tokens each one's write promotes (module doc of insight/dump.py for the keys; -1 / NaN pad)."""
    L, H = model.config.n_layer, model.config.n_head
    token = np.full((L, H, OV_ATTENDED), -1, dtype=np.int64)
    share = np.full((L, H, OV_ATTENDED), np.nan, dtype=np.float32)
    promoted = np.full((L, H, OV_ATTENDED, OV_PROMOTED), -1, dtype=np.int64)
    logit = np.full((L, H, OV_ATTENDED, OV_PROMOTED), np.nan, dtype=np.float32)
    for layer in range(L):
        for head in range(H):
            found = ov_promoted_tokens(model, idx, layer, head, top=OV_PROMOTED, attended=OV_ATTENDED)
            for a, item in enumerate(found):
                token[layer, head, a], share[layer, head, a] = item["token"], item["attention"]
                for p, (v, value) in enumerate(item["promoted"]):
                    promoted[layer, head, a, p], logit[layer, head, a, p] = v, value
    return {"head_ov_token": token, "head_ov_attention": share, "head_ov_promoted": promoted,
            "head_ov_promoted_logit": logit}


@torch.no_grad()
def prompt_circuit_arrays(model, idx: torch.Tensor, probe: torch.Tensor | None) -> tuple[dict[str, np.ndarray], str]:
    """The circuit arrays of the prompt idx (1, T) (insight/dump.py's module doc names each) and a note of what
    they were measured on and why any is NaN. probe: the role probe (insight.roles.role_probe) for the targets'
    duplicate_token and induction changes, or None (those arrays NaN). A 1-token prompt has no next token: path
    ablation and direct logit attribution are NaN (composition, from the weights, and the OV tokens are not)."""
    config = model.config
    L, H = config.n_layer, config.n_head
    T = idx.shape[1]
    # composition_scores and composition_zscores from one pass over the weights (their own formulas)
    squared, variance, n = _composition_terms(model, group_kv=True, rope_offsets=None)
    with np.errstate(divide="ignore", invalid="ignore"):
        z_by_kind = {kind: (squared[kind] - 1.0 / n) / np.sqrt(variance[kind]) for kind in COMPOSITION_KINDS}
    z = _per_query_head(z_by_kind, H)  # (3, L, H, L, H)
    arrays = {"circuit_composition": _per_query_head({kind: np.sqrt(v) for kind, v in squared.items()}, H),
              "circuit_z": z}
    path = {name: np.full((len(COMPOSITION_KINDS), L, H, L, H), np.nan, dtype=np.float32) for name in PATH_NAMES}
    direct = np.full((L, H), np.nan, dtype=np.float32)
    if T >= 2:
        path = _path_arrays(model, idx, probe, z)
        direct = direct_logit_attribution(model, idx, relative_to_mean=True)["heads"].mean(axis=0).astype(np.float32)
        prompt_note = (f"circuit path ablation (zero) of each target head's top {TOP_SOURCES} sources by z per kind "
                       f"on the prompt's {T} tokens; direct logit attribution relative to the mean logit, mean over "
                       f"its {T - 1} predicted positions")
    else:
        prompt_note = ("circuit path ablation and direct logit attribution are NaN: a 1-token prompt has no next "
                       "token to predict (give a longer prompt)")
    probe_note = ("path ablation's duplicate_token and induction changes on the role probe" if probe is not None
                  else "path ablation's duplicate_token and induction changes are NaN: no role probe")
    arrays.update({f"circuit_path_{name}": values for name, values in path.items()})
    arrays["head_direct_logit"] = direct
    arrays.update(_ov_arrays(model, idx))
    note = (f"composition z against a random rotation of the residual stream (a kv head's K and V edges on each of "
            f"its query heads); {prompt_note}; {probe_note}")
    return arrays, note
