"""insight/circuit_plot.py: the picture draws one node per head and one arrow per chosen edge, coloured by its
kind and widest for the largest z; only finite positive z are drawn, at most max_edges, largest first."""
from __future__ import annotations

import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from matplotlib.colors import to_rgba
from matplotlib.patches import FancyArrowPatch

from insight.circuit_plot import KIND_COLOURS, ROLE_COLOURS, draw_circuit, picture_edges

z_values = st.one_of(st.floats(allow_nan=True, allow_infinity=True, width=32), st.floats(-5, 100))
edge_lists = st.lists(st.tuples(st.sampled_from("qkv"), st.just((0, 0)), st.just((1, 0)), z_values), max_size=40)


@settings(max_examples=200, deadline=None)
@given(edge_lists, st.integers(0, 30))
def test_picture_edges_are_the_largest_finite_positive_ones(edges, max_edges):
    shown = picture_edges(edges, max_edges)
    drawable = sorted((e[3] for e in edges if math.isfinite(e[3]) and e[3] > 0), reverse=True)
    assert [e[3] for e in shown] == drawable[:max_edges]
    assert all(e in edges for e in shown)


def arrows(fig):
    return [p for p in fig.axes[0].patches if isinstance(p, FancyArrowPatch)]


def test_one_arrow_per_edge_coloured_by_kind_and_widest_for_the_largest_z(tmp_path):
    edges = [("k", (0, 2), (1, 1), 60.0), ("q", (0, 1), (1, 1), 30.0), ("v", (0, 1), (1, 2), 15.0),
             ("k", (0, 0), (1, 3), -2.0), ("q", (0, 3), (1, 0), math.nan)]  # the last two: not drawn
    labels = {(0, 2): "previous-token", (1, 1): "induction"}
    fig = draw_circuit(edges, 2, 4, labels, path=tmp_path / "c.png", title="t")
    assert (tmp_path / "c.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    drawn = arrows(fig)
    assert len(drawn) == 3
    # drawn weakest first, so the strongest is on top
    colours = [tuple(np.round(a.get_edgecolor()[:3], 3)) for a in drawn]
    assert colours == [tuple(np.round(to_rgba(KIND_COLOURS[k])[:3], 3)) for k in ("v", "q", "k")]
    widths = [a.get_linewidth() for a in drawn]
    assert widths == sorted(widths) and widths[0] < widths[-1]
    nodes = fig.axes[0].collections
    assert len(nodes) == 8  # one per head
    faces = {tuple(np.round(c.get_offsets()[0], 3)): tuple(np.round(c.get_facecolor()[0][:3], 3)) for c in nodes}
    assert faces[(2.0, 0.0)] == tuple(np.round(to_rgba(ROLE_COLOURS["previous-token"])[:3], 3))
    assert faces[(1.0, 1.0)] == tuple(np.round(to_rgba(ROLE_COLOURS["induction"])[:3], 3))
    assert faces[(0.0, 0.0)] == (1.0, 1.0, 1.0)
    texts = {t.get_text() for t in fig.axes[0].texts}
    assert {"60", "30", "15", "L0.H2", "L1.H3", "induction", "previous-token"} <= texts and "-2" not in texts


def test_no_edge_says_so():
    fig = draw_circuit([("k", (0, 0), (1, 0), math.inf)], 2, 1)
    assert not arrows(fig) and "no edge above chance" in {t.get_text() for t in fig.axes[0].texts}
