"""One line per head of what the measures say it does, for a reader who has not learnt them: its role when a
role score names one, the strongest edge out of it that path ablation confirms, its direct write into the logits,
and otherwise what removing it costs. Pure: from the arrays of attn.npz (insight/dump.py's module doc), nothing
is run.

The rules, in the order the clauses appear (joined by "; "):

  role     insight.roles.role_label of its scores (thresholds ROLE_THRESHOLDS): "induction head (0.93)".
  feeds    among the edges out of the head with a path ablation (circuit_path_*: each target's top sources by
           z) whose z >= EDGE_Z_MIN and that path ablation confirms, |Δloss| >= PATH_DLOSS_MIN nats or a role
           score of the target changed by >= PATH_ROLE_MIN, the one that matters most
           (the largest of |Δloss| and |role change|, then z: a high z that costs nothing to cut says less):
           "feeds L1.H1's keys (K, z 35.2; path ablation +1.23 nats, induction -0.75)" (the target's role change
           of largest size, when it passes PATH_ROLE_MIN).
  direct   |head_direct_logit| >= DIRECT_LOGIT_MIN: "writes the next token directly: +0.42 logit" (or "pushes
           the next token down directly: -0.42 logit"), in units of the correct token's logit minus the mean
           logit, what the softmax sees.
  else     no clause above: "removing it costs +1.35 nats, which no role, direct write or confirmed edge
           explains" when ablation_dloss >= ABLATION_DLOSS_MIN, or "no role, direct write or confirmed edge"
           (with the ablation's Δloss when it was measured).

NaN passes no threshold.
"""
from __future__ import annotations

from typing import Mapping

import numpy as np

from insight.circuit_dump import PATH_NAMES
from insight.circuits import COMPOSITION_KINDS, head_name
from insight.roles import ROLE_LABELS, ROLE_NAMES, role_label

EDGE_Z_MIN = 3.0  # an edge this far above chance (composition z) may be named...
PATH_DLOSS_MIN = 0.05  # ...when cutting it moves the loss by this many nats...
PATH_ROLE_MIN = 0.1  # ...or moves a role score of the target by this much (scores run 0..1)
DIRECT_LOGIT_MIN = 0.1  # mean direct contribution to the correct token's logit (minus the mean logit)
ABLATION_DLOSS_MIN = 0.05  # nats: a head this costly to remove that nothing else explains is said to be
KIND_READS = {"q": "queries", "k": "keys", "v": "values"}
_LABEL_SCORE = {ROLE_LABELS[name]: name for name in ROLE_NAMES}  # "previous-token" -> "prev_token"


def _role_clause(scores: Mapping[str, np.ndarray], layer: int, head: int) -> str:
    value = {name: float(scores[name][layer, head]) if name in scores else np.nan for name in ROLE_NAMES}
    label = role_label(value["prev_token"], value["duplicate_token"], value["induction"])
    return f"{label} head ({value[_LABEL_SCORE[label]]:.2f})" if label else ""


def _feeds_clause(circuit: Mapping[str, np.ndarray], layer: int, head: int) -> str:
    """The strongest confirmed edge out of (layer, head) (module doc), or ""."""
    z = circuit["circuit_z"][:, layer, head]  # (3, L, H): into every target
    path = {name: circuit[f"circuit_path_{name}"][:, layer, head] for name in PATH_NAMES}
    best = None
    for kind_index, lb, b in zip(*np.nonzero(~np.isnan(path["dloss"]))):
        edge_z = float(z[kind_index, lb, b])
        dloss = float(path["dloss"][kind_index, lb, b])
        changes = {name: float(path[name][kind_index, lb, b]) for name in ROLE_NAMES}
        role, change = max(((n, c) for n, c in changes.items() if not np.isnan(c)), key=lambda nc: abs(nc[1]),
                           default=("", np.nan))
        confirmed = abs(dloss) >= PATH_DLOSS_MIN or abs(change) >= PATH_ROLE_MIN
        # the edge that matters most: the larger of its loss change (nats) and role change (a 0..1 score) -- a
        # short prompt's loss moves little where the target's role falls apart -- then z
        effect = max(abs(dloss) if not np.isnan(dloss) else 0.0, abs(change) if not np.isnan(change) else 0.0)
        rank = (effect, edge_z)
        if edge_z >= EDGE_Z_MIN and confirmed and (best is None or rank > best[0]):
            best = (rank, edge_z, int(kind_index), int(lb), int(b), dloss, role, change)
    if best is None:
        return ""
    _, edge_z, kind_index, lb, b, dloss, role, change = best
    kind = COMPOSITION_KINDS[kind_index]
    role_part = f", {ROLE_LABELS[role]} {change:+.2f}" if abs(change) >= PATH_ROLE_MIN else ""
    return (f"feeds {head_name(lb, b)}'s {KIND_READS[kind]} ({kind.upper()}, z {edge_z:.1f}; path ablation "
            f"{dloss:+.2f} nats{role_part})")


def _direct_clause(direct: float) -> str:
    if not abs(direct) >= DIRECT_LOGIT_MIN:
        return ""
    if direct > 0:
        return f"writes the next token directly: {direct:+.2f} logit"
    return f"pushes the next token down directly: {direct:+.2f} logit"


def head_descriptions(scores: Mapping[str, np.ndarray], circuit: Mapping[str, np.ndarray]) -> list[list[str]]:
    """[layer][head] -> one line (module doc's rules). scores: {name: (n_layer, n_head)} of prompt_head_scores
    (any of prev_token, duplicate_token, induction, ablation_dloss; a missing one counts as NaN); circuit: the
    arrays of insight.circuit_dump.prompt_circuit_arrays (circuit_z, circuit_path_*, head_direct_logit)."""
    direct = circuit["head_direct_logit"]
    n_layer, n_head = direct.shape
    dloss = scores.get("ablation_dloss", np.full((n_layer, n_head), np.nan))
    lines = []
    for layer in range(n_layer):
        row = []
        for head in range(n_head):
            parts = [p for p in (_role_clause(scores, layer, head), _feeds_clause(circuit, layer, head),
                                 _direct_clause(float(direct[layer, head]))) if p]
            cost = float(dloss[layer, head])
            if not parts:
                if cost >= ABLATION_DLOSS_MIN:
                    parts = [f"removing it costs {cost:+.2f} nats, which no role, direct write or confirmed edge "
                             f"explains"]
                else:
                    measured = f" (ablation {cost:+.2f} nats)" if np.isfinite(cost) else ""
                    parts = [f"no role, direct write or confirmed edge{measured}"]
            row.append("; ".join(parts))
        lines.append(row)
    return lines
