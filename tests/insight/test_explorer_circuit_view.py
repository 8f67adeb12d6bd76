"""The explorer's Circuit tab (insight/explorer/circuit_view.js) in headless Chromium (tests/explorer_browser.py),
against the attn.npz of the same dump: a node per head, each drawn edge one of its target's top sources by z, and the
panel of a clicked head with its inputs, outputs, direct logit, description and OV tokens."""
from __future__ import annotations

import numpy as np
import pytest

from data.tokenizer import CharTokenizer
from insight.circuit_dump import TOP_SOURCES, top_sources
from insight.circuits import COMPOSITION_KINDS
from insight.dump import dump_internals, prompt_circuit_scores, prompt_head_scores
from insight.explorer import HeadScores, write_explorer
from tests.explorer_browser import browser, open_page  # noqa: F401 (browser: a fixture)
from tests.insight.test_explorer import CHARS, ids, lively_model

L, H = 3, 4


@pytest.fixture(scope="module")
def dumped(tmp_path_factory):
    """What sample.py --dump-attn writes for a 3-layer GQA model, the circuit included."""
    model = lively_model(seed=4, n_layer=L, n_kv_head=2)
    idx = ids(12, seed=5)
    tokenizer = CharTokenizer(CHARS)
    scores, note = prompt_head_scores(model, idx, tokenizer)
    out = tmp_path_factory.mktemp("circuit_view")
    dump_internals(model.attention_internals(idx), {layer: [0] for layer in range(L)},
                   [f"t{i}" for i in idx[0].tolist()], out,
                   scores=HeadScores(scores, note, prompt_circuit_scores(model, idx, tokenizer)))
    with np.load(out / "attn.npz") as npz:
        arrays = {name: npz[name] for name in npz.files}
    return out, arrays, model, idx


def edges_drawn(driver) -> list[tuple]:
    return driver.execute_script("""return Array.from(document.querySelectorAll('#circuit-svg path.circuit-edge'),
        p => [p.dataset.kind, p.dataset.source, p.dataset.target, +p.dataset.z])""")


def click(driver, element_id: str) -> None:
    """A click on an SVG group (WebDriver's own click wants an element with a box of its own)."""
    driver.execute_script(f"document.getElementById('{element_id}').dispatchEvent(new MouseEvent('click', "
                          f"{{bubbles: true}}))")


def test_every_head_is_a_node_and_every_edge_a_top_source_past_the_threshold(browser, dumped):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select
    out, npz, _, _ = dumped
    open_page(browser, out / "attention.html")
    browser.find_element(By.ID, "tab-circuit").click()
    nodes = browser.execute_script("""return Array.from(document.querySelectorAll('#circuit-svg g.circuit-node'),
        g => [+g.dataset.layer, +g.dataset.head])""")
    assert sorted(nodes) == [[layer, h] for layer in range(L) for h in range(H)]
    Select(browser.find_element(By.ID, "circuit-per-target")).select_by_value(str(TOP_SOURCES))
    z_min = browser.find_element(By.ID, "circuit-z-min")
    z_min.clear()
    z_min.send_keys("-1e9\n")  # every top source shown
    expected = {(kind, f"{la}.{a}", f"{lb}.{b}") for k, kind in enumerate(COMPOSITION_KINDS)
                for lb in range(1, L) for b in range(H) for la, a in top_sources(npz["circuit_z"][k], (lb, b))}
    drawn = edges_drawn(browser)
    assert {tuple(e[:3]) for e in drawn} == expected and len(drawn) == len(expected)
    for kind, source, target, z in drawn:
        at = (COMPOSITION_KINDS.index(kind), *map(int, source.split(".")), *map(int, target.split(".")))
        assert z == pytest.approx(float(npz["circuit_z"][at]), rel=5e-5)  # 5 significant digits
    Select(browser.find_element(By.ID, "circuit-per-target")).select_by_value("1")  # the strongest source only
    assert len(edges_drawn(browser)) == 3 * (L - 1) * H
    browser.find_element(By.ID, "circuit-kind-k").click()  # K edges off
    assert {e[0] for e in edges_drawn(browser)} == {"q", "v"}
    browser.find_element(By.ID, "circuit-kind-k").click()
    threshold = float(np.median(npz["circuit_z"][np.isfinite(npz["circuit_z"])]))
    z_min.clear()
    z_min.send_keys(f"{threshold}\n")
    assert all(e[3] >= threshold for e in edges_drawn(browser)) and edges_drawn(browser)


def test_a_clicked_head_shows_its_inputs_outputs_and_what_it_writes(browser, dumped):
    from selenium.webdriver.common.by import By
    out, npz, _, _ = dumped
    open_page(browser, out / "attention.html")
    browser.find_element(By.ID, "tab-circuit").click()
    layer, head = 2, 1
    click(browser, f"circuit-node-{layer}-{head}")
    assert browser.find_element(By.ID, "circuit-title").text.startswith(f"L{layer}.H{head}")
    assert browser.find_element(By.ID, "circuit-desc").text == str(npz["head_description"][layer, head])
    rows = browser.execute_script("""return Array.from(document.querySelectorAll('#circuit-inputs tbody tr'), r =>
        [r.dataset.kind, r.dataset.source, +r.dataset.z, +r.dataset.dloss])""")
    expected = {(kind, f"{la}.{a}") for k, kind in enumerate(COMPOSITION_KINDS)
                for la, a in top_sources(npz["circuit_z"][k], (layer, head))}
    assert {tuple(r[:2]) for r in rows} == expected and len(rows) == 3 * TOP_SOURCES
    assert [r[2] for r in rows] == sorted((r[2] for r in rows), reverse=True)  # strongest first
    for kind, source, z, dloss in rows:
        at = (COMPOSITION_KINDS.index(kind), *map(int, source.split(".")), layer, head)
        assert dloss == pytest.approx(float(npz["circuit_path_dloss"][at]), rel=5e-5, abs=1e-9)
    facts = browser.find_element(By.ID, "circuit-facts").text
    assert f"direct logit {npz['head_direct_logit'][layer, head]:+.2f}" in facts
    assert f"ablation Δloss {npz['head_ablation_dloss'][layer, head]:+.2f}" in facts
    ov_rows = browser.find_elements(By.CSS_SELECTOR, "#circuit-ov tbody tr")
    assert len(ov_rows) == int((npz["head_ov_token"][layer, head] >= 0).sum())
    assert browser.find_element(By.ID, "circuit-outputs").text == "none"  # the last layer feeds no head
    click(browser, "circuit-node-0-2")  # a layer-0 head: no inputs, and it feeds the heads that name it
    assert "layer 0 reads no earlier head" in browser.find_element(By.ID, "circuit-inputs").text
    targets = browser.execute_script("""return Array.from(document.querySelectorAll('#circuit-outputs tbody tr'), r =>
        [r.dataset.kind, r.dataset.target])""")
    named = {(kind, f"{lb}.{b}") for k, kind in enumerate(COMPOSITION_KINDS) for lb in range(1, L) for b in range(H)
             if (0, 2) in top_sources(npz["circuit_z"][k], (lb, b))}
    assert {tuple(t) for t in targets} == named or (len(targets) == 12 and {tuple(t) for t in targets} <= named)


def test_a_page_without_a_circuit_has_no_circuit_tab(browser, dumped, tmp_path):
    from selenium.webdriver.common.by import By
    _, _, model, idx = dumped
    page = write_explorer(tmp_path / "plain.html", model.attention_internals(idx), [f"t{i}" for i in idx[0].tolist()])
    open_page(browser, page)
    assert not browser.find_element(By.ID, "tab-circuit").is_displayed()
