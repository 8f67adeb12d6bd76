"""What --dump-attn selects and what its files say: the layer/head spec against a set-based reading of it
(generated specs), the depth the page reports, the axes of the heatmaps, and the page's guard against a
script that would end its own <script> element."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import insight.explorer as explorer
from insight.dump import dump_internals, parse_layer_heads
from insight.heatmap import draw_heatmap
from tests.insight.test_explorer import ids, lively_model, page_data


def spec_meaning(parts: list[tuple[int, int | None]], n_head: int) -> dict[int, list[int]]:
    """{layer: heads} of a list of (layer, head or None = every head), first mention first."""
    out: dict[int, list[int]] = {}
    for layer, head in parts:
        for h in range(n_head) if head is None else [head]:
            if h not in out.setdefault(layer, []):
                out[layer].append(h)
    return out


@settings(max_examples=200, deadline=None)
@given(n_layer=st.integers(1, 6), n_head=st.integers(1, 6), data=st.data())
def test_a_spec_selects_exactly_the_layers_and_heads_it_names(n_layer, n_head, data):
    parts = data.draw(st.lists(st.tuples(st.integers(0, n_layer - 1), st.none() | st.integers(0, n_head - 1)),
                               min_size=1, max_size=8))
    spec = ",".join(f"{layer}" if head is None else f"{layer}:{head}" for layer, head in parts)
    assert parse_layer_heads(spec, n_layer, n_head) == spec_meaning(parts, n_head)
    assert parse_layer_heads(f" {spec.replace(',', ' , ')} ,", n_layer, n_head) == spec_meaning(parts, n_head)


def test_all_selects_every_head_of_every_layer_and_a_bad_part_names_the_valid_range():
    assert parse_layer_heads("all", 3, 2) == {0: [0, 1], 1: [0, 1], 2: [0, 1]}
    for spec, message in (("3", "layer 3 is out of range: the model has layers 0..2"),
                          ("1:2", "head 2 is out of range: each layer has heads 0..1"),
                          ("-1", "layer -1 is out of range: the model has layers 0..2"),
                          ("a:1", "'a:1' is not a layer or layer:head"), (",", "selects no layer")):
        with pytest.raises(ValueError) as e:
            parse_layer_heads(spec, 3, 2)
        assert message in str(e.value), (spec, str(e.value))


def test_the_page_of_a_dump_of_some_layers_reports_the_models_depth(tmp_path):
    model = lively_model(seed=2, n_layer=3)
    idx = ids(6)
    internals = model.attention_internals(idx, layers=[1])
    dump_internals(internals, {1: [0]}, list("abcdef"), tmp_path, options=explorer.ExplorerOptions(n_layer=3))
    meta = page_data((tmp_path / "attention.html").read_text(encoding="utf-8"))[0]
    assert (meta["n_layer"], meta["layers"]) == (3, [1])


def test_heatmaps_name_their_axes_key_and_query():
    w = torch.eye(4)[None].expand(2, 4, 4)
    fig = draw_heatmap(w, title="layer 0")
    assert (fig._supxlabel.get_text(), fig._supylabel.get_text(), fig._suptitle.get_text()) == \
        ("key", "query", "layer 0")


def test_a_script_that_would_close_its_own_element_is_refused(monkeypatch):
    real = explorer._asset
    monkeypatch.setattr(explorer, "_asset", lambda name: real(name) + ("\n// </SCRIPT>" if name.endswith(".js") else ""))
    model = lively_model(seed=1)
    with pytest.raises(ValueError, match="explorer.js must not contain '</script'"):
        explorer.explorer_html(model.attention_internals(ids(4)), list("abcd"))
