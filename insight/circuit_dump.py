"""The circuit arrays of one prompt, as sample.py --dump-attn writes them into attn.npz (insight/dump.py's module
doc lists the keys): insight/circuits.py's measures of every head of the model, laid out as (n_layer, n_head)
arrays beside prompt_head_scores', and, for the edges between heads, as (kind, source layer, source head, target
layer, target head) arrays with the kind axis in COMPOSITION_KINDS order (q, k, v).

Path ablation of every pair is n_head² × n_layer² / 2 runs of the later layers (10,000 at GPT-2 small's 144 heads),
so it is run by a rule: for each target head of layer >= 1 and each kind, its TOP_SOURCES sources of largest
composition z (NaN everywhere else). Those are the edges the z names; path ablation says whether each matters.
"""
from __future__ import annotations

import numpy as np
import torch

from insight.circuits import (COMPOSITION_KINDS, composition_scores, composition_zscores, direct_logit_attribution,
                              ov_promoted_tokens, path_ablation)
from insight.roles import ROLE_NAMES

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
    """The k (source layer, source head) of largest z into `target` (lb, b), largest first, from z (L, H, L, H) of
    one kind; NaN never chosen (+inf first); ties in (layer, head) order. Fewer when fewer earlier heads exist."""
    lb, b = target
    column = z[:lb, :, lb, b].reshape(-1)  # (lb * H,): sources in (layer, head) order
    finite = np.flatnonzero(~np.isnan(column))
    order = finite[np.argsort(-column[finite], kind="stable")][:k]
    n_head = z.shape[1]
    return [(int(i) // n_head, int(i) % n_head) for i in order]


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
    z = _per_query_head(composition_zscores(model), H)  # (3, L, H, L, H)
    arrays = {"circuit_composition": _per_query_head(composition_scores(model), H), "circuit_z": z}
    path = {name: np.full((len(COMPOSITION_KINDS), L, H, L, H), np.nan, dtype=np.float32) for name in PATH_NAMES}
    direct = np.full((L, H), np.nan, dtype=np.float32)
    if T >= 2:
        for kind_index, kind in enumerate(COMPOSITION_KINDS):
            for lb in range(1, L):
                for b in range(H):
                    sources = top_sources(z[kind_index], (lb, b))
                    found = path_ablation(model, idx, probe, kind, (lb, b), sources)
                    for name in PATH_NAMES:
                        for (la, a), value in zip(sources, found[name]):
                            path[name][kind_index, la, a, lb, b] = value
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
