"""The circuit picture: heads as nodes, composition edges between them by kind and strength.

One node per head, a row per layer (layer 0 at the bottom, as the residual stream flows up), named L.H with its
role label under it (insight.roles.role_label) when it has one. One arrow per edge (insight.circuits.Edge: kind,
source head, target head, z), from the head that writes to the head that reads: its colour the kind (Q, K, V
in KIND_COLOURS), its width and opacity the z relative to the picture's largest, its z written beside it. Edges
of the three kinds between the same two heads bend apart so that each stays visible. At most MAX_EDGES, the
largest z first: a 12 x 12 model has hundreds of strongest sources, and a picture of all of them shows none.

The monitor draws it at every snapshot from each head's strongest source per kind (out_dir/attn/circuit/, W&B
`attn/circuit_picture`); docs/head_roles.md shows the one of configs/induction.yaml's last step.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

from insight.circuits import Edge, head_name
from insight.heatmap import save_png

KIND_COLOURS = {"q": "tab:blue", "k": "tab:red", "v": "tab:green"}
KIND_BEND = {"q": -0.25, "k": 0.0, "v": 0.25}  # arc3 curvature: the three kinds of one pair drawn apart
MAX_EDGES = 24
if TYPE_CHECKING:
    from matplotlib.figure import Figure

ROLE_COLOURS = {"induction": "#f4c430", "previous-token": "#9ecae1", "duplicate-token": "#c7e9c0"}


def picture_edges(edges: Sequence[Edge], max_edges: int = MAX_EDGES) -> list[Edge]:
    """The edges a picture draws: those with a finite positive z (a z at or below 0 is chance or less, an infinite
    one has no spread to measure it by), the max_edges largest, largest first."""
    drawable = [edge for edge in edges if math.isfinite(edge[3]) and edge[3] > 0]
    return sorted(drawable, key=lambda edge: -edge[3])[:max_edges]


def draw_circuit(edges: Sequence[Edge], n_layer: int, n_head: int, labels: dict[tuple[int, int], str] | None = None,
                 path: str | Path | None = None, title: str = "circuit") -> "Figure":
    """The picture (module doc) of `edges` (picture_edges chooses among them) between the heads of an n_layer x
    n_head model; labels: {(layer, head): role label} ("" or absent: none). Returns the Figure (a pyplot-free Agg
    figure), also saved as a PNG when path is given (save_png)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D
    from matplotlib.patches import FancyArrowPatch

    labels = labels or {}
    shown = picture_edges(edges)
    fig = Figure(figsize=(max(4.0, 1.3 * n_head + 1.5), max(3.0, 1.6 * n_layer + 1.0)), dpi=100,
                 layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    largest = max((edge[3] for edge in shown), default=1.0)
    for kind, (la, a), (lb, b), z in reversed(shown):  # the strongest drawn last, on top
        strength = z / largest  # (0, 1]
        arrow = FancyArrowPatch((a, la), (b, lb), connectionstyle=f"arc3,rad={KIND_BEND[kind]}",
                                arrowstyle="-|>", mutation_scale=10 + 6 * strength, shrinkA=14, shrinkB=14,
                                linewidth=0.6 + 3.4 * strength, color=KIND_COLOURS[kind], alpha=0.25 + 0.75 * strength)
        ax.add_patch(arrow)
        # the z at the arc's apex: arc3 puts its control point rad x (dy, -dx) off the chord's middle, the
        # curve passes half as far (in display space, so near the arc where the axes' scales differ)
        bend = KIND_BEND[kind] / 2
        apex = ((a + b) / 2 + bend * (lb - la), (la + lb) / 2 - bend * (b - a))
        ax.annotate(f"{z:.0f}", apex, fontsize=7, color=KIND_COLOURS[kind], ha="center", va="center",
                    bbox={"boxstyle": "round,pad=0.1", "facecolor": "white", "edgecolor": "none", "alpha": 0.7})
    for layer in range(n_layer):
        for head in range(n_head):
            role = labels.get((layer, head), "")
            ax.scatter([head], [layer], s=900, color=ROLE_COLOURS.get(role, "white"), edgecolors="0.3", zorder=3)
            ax.annotate(head_name(layer, head), (head, layer), ha="center", va="center", fontsize=7, zorder=4)
            if role:
                ax.annotate(role, (head, layer - 0.27), ha="center", va="top", fontsize=6, color="0.25", zorder=4,
                            bbox={"boxstyle": "round,pad=0.1", "facecolor": "white", "edgecolor": "none"})
    ax.set(xlim=(-0.6, n_head - 0.4), ylim=(-0.6, n_layer - 0.4), title=title)
    ax.set_xticks(range(n_head), [f"head {h}" for h in range(n_head)], fontsize=7)
    ax.set_yticks(range(n_layer), [f"layer {layer}" for layer in range(n_layer)], fontsize=7)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    kinds = sorted({edge[0] for edge in shown}, key="qkv".index)
    if kinds:
        ax.legend([Line2D([], [], color=KIND_COLOURS[k], linewidth=2) for k in kinds],
                  [f"{k.upper()}-composition (z)" for k in kinds], fontsize=7, loc="upper left",
                  bbox_to_anchor=(1.0, 1.0))
    else:
        ax.annotate("no edge above chance", (0.5, 0.5), xycoords="axes fraction", ha="center", color="0.4")
    return save_png(fig, path)
