"""The explorer in a real browser: headless Chromium through Selenium opens the page that
sample.py's dump writes, straight from disk (file://), and the tests check what it draws against attn.npz.

The browser is tests/explorer_browser.py's; the text view's tests are in insight/test_explorer_text_view.py.
"""
from __future__ import annotations

import json

import numpy as np
import pytest

from data.tokenizer import CharTokenizer
from insight.dump import dump_internals, prompt_head_scores
from insight.explorer import ExplorerOptions, HeadScores, write_explorer
from insight.explorer.pack import dequantise_rows, quantise_rows
from insight.roles import role_label
from tests.explorer_browser import browser, open_page  # noqa: F401 (browser: a fixture)
from tests.insight.test_explorer import CHARS, ids, lively_model

SELECTED = {0: [0, 1, 2, 3], 1: [1, 3]}
T = 24


@pytest.fixture(scope="module")
def dumped(tmp_path_factory):
    """What sample.py --dump-attn writes for a GQA model (heads 0,1 share a kv head) with lively weights,
    head scores included."""
    model = lively_model(seed=11, n_kv_head=2)
    idx = ids(T, seed=12)
    internals = model.attention_internals(idx)
    out = tmp_path_factory.mktemp("dump")
    tokens = [f"t{i}" for i in idx[0].tolist()]
    scores, note = prompt_head_scores(model, idx, CharTokenizer(CHARS))
    dump_internals(internals, SELECTED, tokens, out, token_ids=idx[0].tolist(), scores=HeadScores(scores, note))
    with np.load(out / "attn.npz") as npz:
        arrays = {name: npz[name] for name in npz.files}
    return out, arrays, internals, tokens


def viridis(x: np.ndarray) -> np.ndarray:
    """The page's colour map: five viridis stops, linearly interpolated (x in [0, 1]) -> RGB 0..255."""
    stops = np.array([[68, 1, 84], [59, 82, 139], [33, 145, 140], [94, 201, 98], [253, 231, 37]], dtype=float)
    t = np.clip(x, 0, 1) * 4
    k = np.minimum(np.floor(t), 3).astype(int)
    f = (t - k)[..., None]
    return np.round(stops[k] * (1 - f) + stops[k + 1] * f)


def choose(driver, layer: int, heads: list[int], query: int) -> None:
    """Pick a layer, switch exactly `heads` on, click query token `query` (as a user would)."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select
    driver.find_element(By.ID, "tab-head").click()
    Select(driver.find_element(By.ID, "layer-select")).select_by_value(str(layer))
    for h in range(4):
        box = driver.find_element(By.ID, f"head-toggle-{h}")
        if box.is_selected() != (h in heads):
            box.click()
    driver.find_element(By.ID, f"q-tok-{query}").click()


def drawn(driver) -> list[dict]:
    return driver.execute_script("""return Array.from(document.querySelectorAll('#lines line.attn-line'), l => ({
        head: +l.dataset.head, query: +l.dataset.query, key: +l.dataset.key, alpha: +l.dataset.alpha,
        weight: +l.dataset.weight, opacity: +l.getAttribute('stroke-opacity'), colour: l.getAttribute('stroke')}))""")


def test_head_view_draws_the_weights_of_attn_npz(browser, dumped):
    out, npz, _, _ = dumped
    open_page(browser, out / "attention.html")
    layer, heads, i = 1, [0, 2], 17
    choose(browser, layer, heads, i)
    lines = drawn(browser)
    assert sorted((l["head"], l["key"]) for l in lines) == [(h, j) for h in heads for j in range(i + 1)]
    w = npz[f"layer_{layer}"]
    for l in lines:
        assert l["query"] == i
        step = w[l["head"], i].max() / 510  # half of one 8-bit step of this row
        assert abs(l["alpha"] - w[l["head"], i, l["key"]]) <= step * (1 + 1e-4) + 1e-7, l
        assert l["opacity"] == pytest.approx(l["alpha"], abs=1e-6)  # weight as opacity
    assert len({l["colour"] for l in lines}) == 2  # one colour per head
    assert np.ptp([l["alpha"] for l in lines]) > 0.1  # not a uniform blur: the comparison means something


def test_step_by_step_row_is_the_model_row(browser, dumped):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select
    out, npz, internals, tokens = dumped
    open_page(browser, out / "attention.html")
    layer, head, i = 0, 3, 20
    choose(browser, layer, [head], i)
    Select(browser.find_element(By.ID, "step-head")).select_by_value(str(head))
    cells = browser.execute_script("""return Array.from(document.querySelectorAll('#step-table tbody tr[data-key]'), r => ({
        key: +r.dataset.key, dot: +r.querySelector('td.dot').dataset.value,
        scaled: +r.querySelector('td.scaled').dataset.value, alpha: +r.querySelector('td.alpha').dataset.value}))""")
    assert [c["key"] for c in cells] == list(range(i + 1))
    alpha = np.array([c["alpha"] for c in cells])
    np.testing.assert_allclose(alpha, npz[f"layer_{layer}"][head, i, :i + 1], atol=1e-4, rtol=0)
    assert alpha.sum() == pytest.approx(1.0, abs=1e-9)
    it = internals[layer]
    q, k = it.q[0, head, i].double(), it.k[0, head // 2, :i + 1].double()  # head 3 reads kv head 1
    np.testing.assert_allclose([c["dot"] for c in cells], (k @ q).numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose([c["scaled"] for c in cells], [c["dot"] / np.sqrt(8) for c in cells], rtol=1e-12)
    future = browser.find_elements(By.CSS_SELECTOR, "#step-table tr.future")
    assert future and all("−∞" in row.text for row in future)  # keys 21.. are masked, shown as -inf
    text = browser.find_element(By.ID, "step-output").text
    expected = it.weights[0, head, i].double() @ it.v[0, head // 2].double()  # the weighted sum of the values
    shown = [float(x) for x in text.split("[", 1)[1].rstrip("]").split(", ")]
    np.testing.assert_allclose(shown, expected.numpy(), atol=1.5e-3)
    browser.find_element(By.ID, "step-sort").click()  # the same rows, largest weight first
    order = browser.execute_script("return Array.from(document.querySelectorAll('#step-table tr[data-key]'), r => +r.dataset.key)")
    assert order == sorted(range(i + 1), key=lambda j: -alpha[j]) and order != list(range(i + 1))
    browser.find_element(By.ID, "step-sort").click()


def test_value_weighted_toggle_draws_alpha_times_value_norm(browser, dumped):
    from selenium.webdriver.common.by import By
    out, npz, _, _ = dumped
    open_page(browser, out / "attention.html")
    layer, heads, i = 1, [1, 3], 22
    choose(browser, layer, heads, i)
    before = {(l["head"], l["key"]): l["opacity"] for l in drawn(browser)}
    browser.find_element(By.ID, "value-weighted").click()
    lines = drawn(browser)
    w, vw, norms = npz[f"layer_{layer}"], npz[f"value_weighted_{layer}"], npz[f"value_norm_{layer}"]
    for l in lines:
        h, j = l["head"], l["key"]
        tolerance = w[h, i].max() / 510 * norms[h, j] * (1 + 1e-4) + 1e-6
        assert abs(l["weight"] - vw[h, i, j]) <= tolerance, l
    top = max(l["weight"] for l in lines)
    for l in lines:
        assert l["opacity"] == pytest.approx(l["weight"] / top, abs=1e-6)
    after = {(l["head"], l["key"]): l["opacity"] for l in lines}
    assert after.keys() == before.keys()
    assert max(abs(after[key] - before[key]) for key in after) > 0.05  # the toggle changes what is drawn
    browser.find_element(By.ID, "value-weighted").click()  # and back
    assert {(l["head"], l["key"]): l["opacity"] for l in drawn(browser)} == before


def test_model_view_and_statistics(browser, dumped):
    from selenium.webdriver.common.by import By
    out, npz, _, _ = dumped
    open_page(browser, out / "attention.html")
    browser.find_element(By.ID, "tab-model").click()
    assert len(browser.find_elements(By.CSS_SELECTOR, "canvas.thumb")) == 2 * 4
    browser.find_element(By.ID, "thumb-1-2").click()
    assert browser.find_element(By.ID, "opened-title").text == "layer 1, head 2"
    # the opened map, one pixel per (query, key): grey for the future, else the colour of sqrt(8-bit weight)
    pixels = np.array(browser.execute_script("""const c = document.getElementById('opened-map');
        return Array.from(c.getContext('2d').getImageData(0, 0, c.width, c.height).data)"""), dtype=float)
    pixels = pixels.reshape(T, T, 4)[..., :3]
    codes, row_max = quantise_rows(npz["layer_1"])
    colours = viridis(np.sqrt(dequantise_rows(codes, row_max)[2]))
    future = np.triu(np.ones((T, T), dtype=bool), 1)
    assert (pixels[future] == 217).all()
    assert np.abs(pixels[~future] - colours[~future]).max() <= 4  # within one colour step
    assert browser.find_element(By.ID, "step-head").get_attribute("value") == "2"  # the step view follows
    browser.find_element(By.ID, "tab-stats").click()
    browser.find_element(By.CSS_SELECTOR, "#stats-table th[data-col='entropy']").click()
    rows = browser.execute_script("""return Array.from(document.querySelectorAll('#stats-table tbody tr'), r =>
        [+r.dataset.layer, +r.dataset.head, +r.querySelector('td[data-col=entropy]').dataset.value])""")
    assert len(rows) == 8 and [r[2] for r in rows] == sorted(r[2] for r in rows)
    from insight.stats import head_stats
    for layer, head, entropy in rows:
        assert entropy == pytest.approx(head_stats(npz[f"layer_{layer}"])["entropy"][head], abs=1e-9)


def test_a_head_without_stored_q_k_v_says_how_to_get_them(browser, dumped, tmp_path):
    from selenium.webdriver.common.by import By
    _, _, internals, tokens = dumped
    page = write_explorer(tmp_path / "small.html", internals, tokens, options=ExplorerOptions(max_bytes=1))  # room for the weights only
    open_page(browser, page)
    text = browser.find_element(By.ID, "step-missing").text
    assert "sample.py --dump-attn 0:0" in text


def test_the_page_makes_no_network_request(browser, dumped):
    """After using every view, the browser has requested nothing but the file itself (DevTools Network
    events) and the page lists no resource entries."""
    from selenium.webdriver.common.by import By
    out, _, _, _ = dumped
    browser.get_log("performance")  # drop the earlier tests' events
    page = out / "attention.html"
    open_page(browser, page)
    choose(browser, 1, [0, 1, 2, 3], 23)
    browser.find_element(By.ID, "value-weighted").click()
    browser.find_element(By.ID, "tab-text").click()
    browser.find_element(By.ID, "t-tok-5").click()
    browser.find_element(By.ID, "text-vw").click()
    browser.find_element(By.ID, "tab-model").click()
    browser.find_element(By.ID, "thumb-0-1").click()
    browser.find_element(By.ID, "tab-stats").click()
    requests = [json.loads(entry["message"])["message"] for entry in browser.get_log("performance")]
    urls = [m["params"]["request"]["url"] for m in requests if m["method"] == "Network.requestWillBeSent"]
    assert urls == [page.resolve().as_uri()], urls
    assert browser.execute_script("return performance.getEntriesByType('resource').length") == 0
    errors = [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
    assert not errors, errors


# --- the Statistics tab: what each head does ---------------------------------------------------------

SCORES = ("prev_token", "duplicate_token", "induction", "ablation_dloss")


def table(driver) -> list[dict]:
    """The Statistics tab's rows as shown: {column: data-value} (numbers as floats, the role as text)."""
    cells = driver.execute_script("""return Array.from(document.querySelectorAll('#stats-table tbody tr'), r =>
        Object.fromEntries(Array.from(r.cells, c => [c.dataset.col, c.dataset.value])))""")
    return [{k: (v if k == "role" else float(v)) for k, v in row.items()} for row in cells]


def test_statistics_tab_shows_the_head_scores_of_attn_npz(browser, dumped):
    """Every head's prev-token, duplicate, induction and Δloss cell holds attn.npz's head_* value exactly
    (float32), its role cell role_label of them, and the page states the thresholds."""
    from selenium.webdriver.common.by import By
    from insight.stats import head_stats
    out, npz, _, _ = dumped
    open_page(browser, out / "attention.html")
    browser.find_element(By.ID, "tab-stats").click()
    header = [th.get_attribute("data-col") for th in browser.find_elements(By.CSS_SELECTOR, "#stats-table th")]
    assert header == ["layer", "head", "role", *SCORES, "entropy", "sink_mass", "mean_distance", "decay_gamma", "decay_r2"]
    rows = table(browser)
    assert sorted((int(r["layer"]), int(r["head"])) for r in rows) == [(L, h) for L in range(2) for h in range(4)]
    for r in rows:
        L, h = int(r["layer"]), int(r["head"])
        for name in SCORES:
            assert r[name] == float(npz[f"head_{name}"][L, h]), (name, L, h)
        assert r["role"] == role_label(*(float(npz[f"head_{n}"][L, h]) for n in SCORES[:3]))
        stats = head_stats(npz[f"layer_{L}"])
        assert r["decay_r2"] == pytest.approx(stats["decay_r2"][h], abs=1e-12)
    assert np.ptp([r["ablation_dloss"] for r in rows]) > 1e-3  # the heads differ: equality means something
    legend = browser.find_element(By.ID, "stats-legend").text
    for fragment in ("induction when induction > 0.4", "previous-token when prev-token > 0.4",
                     "duplicate-token when duplicate > 0.4", "role probe", "24 tokens"):
        assert fragment in legend, (fragment, legend)


def test_sorting_by_any_column_orders_the_rows(browser, dumped):
    """A click on a header sorts by it ascending, a second click descending; a missing value (an empty
    role, NaN) comes last either way."""
    from selenium.webdriver.common.by import By
    out, _, _, _ = dumped
    open_page(browser, out / "attention.html")
    browser.find_element(By.ID, "tab-stats").click()
    cols = [th.get_attribute("data-col") for th in browser.find_elements(By.CSS_SELECTOR, "#stats-table th")]
    for col in cols:
        th = browser.find_element(By.CSS_SELECTOR, f"#stats-table th[data-col='{col}']")
        for direction in (1, -1):
            th.click()
            values = [r[col] for r in table(browser)]
            present = [v for v in values if v not in ("", None) and not (isinstance(v, float) and np.isnan(v))]
            assert values[:len(present)] == present, col  # missing values last
            assert present == sorted(present, reverse=direction < 0), (col, direction, values)
            assert th.get_attribute("data-sort") == ("asc" if direction > 0 else "desc")
    assert len(set(r["ablation_dloss"] for r in table(browser))) == 8  # distinct values: order is checkable


def test_a_role_label_per_head_from_the_scores_given(browser, dumped, tmp_path):
    """Scores passed to write_explorer (as a training run's snapshot does) give the labels by the stated
    rule: induction first, then previous-token, then duplicate-token, each above 0.4."""
    _, _, internals, tokens = dumped
    scores = {name: np.zeros((2, 4)) for name in SCORES}
    scores["induction"][1, 2] = 0.95
    scores["duplicate_token"][1, 2] = 0.6
    scores["prev_token"][0, 1] = 0.41
    scores["duplicate_token"][0, 3] = 0.5
    scores["prev_token"][1, 0] = 0.4  # not above the threshold
    scores["ablation_dloss"][0, 0] = np.nan
    page = write_explorer(tmp_path / "roles.html", internals, tokens, scores=HeadScores(scores, "over the probe"))
    open_page(browser, page)
    from selenium.webdriver.common.by import By
    browser.find_element(By.ID, "tab-stats").click()
    roles = {(int(r["layer"]), int(r["head"])): r["role"] for r in table(browser)}
    assert {k: v for k, v in roles.items() if v} == {(1, 2): "induction", (0, 1): "previous-token",
                                                    (0, 3): "duplicate-token"}
    cell = browser.find_element(By.CSS_SELECTOR, "#stats-table tr[data-layer='0'][data-head='0'] td[data-col='ablation_dloss']")
    assert cell.text == "–"
    assert "over the probe" in browser.find_element(By.ID, "stats-legend").text


def test_clicking_a_row_opens_that_head(browser, dumped):
    """A short prompt's page opens heads in the head view: that layer, only that head on, the step view
    following it."""
    from selenium.webdriver.common.by import By
    out, npz, _, _ = dumped
    open_page(browser, out / "attention.html")
    browser.find_element(By.ID, "tab-stats").click()
    browser.find_element(By.CSS_SELECTOR, "#stats-table th[data-col='induction']").click()
    browser.find_element(By.CSS_SELECTOR, "#stats-table tr[data-layer='1'][data-head='2']").click()
    assert browser.find_element(By.ID, "tab-head").get_attribute("class") == "tab active"
    assert not browser.find_element(By.ID, "pane-stats").is_displayed()
    assert browser.find_element(By.ID, "layer-select").get_attribute("value") == "1"
    assert [h for h in range(4) if browser.find_element(By.ID, f"head-toggle-{h}").is_selected()] == [2]
    assert browser.find_element(By.ID, "step-head").get_attribute("value") == "2"
    from selenium.webdriver.common.action_chains import ActionChains
    ActionChains(browser).move_to_element(browser.find_element(By.TAG_NAME, "h1")).perform()  # off the tokens
    lines = drawn(browser)
    assert {l["head"] for l in lines} == {2} and len(lines) == T  # the last query's T keys
    step = browser.execute_script("return Array.from(document.querySelectorAll('#step-table td.alpha'), c => +c.dataset.value)")
    np.testing.assert_allclose(step[:T], npz["layer_1"][2, T - 1], atol=1e-4)


# --- the text view -----------------------------------------------------------------------------------


def test_step_by_step_names_the_softmax(browser, dumped):
    from selenium.webdriver.common.by import By
    out, _, _, _ = dumped
    open_page(browser, out / "attention.html")
    formulas = [f.text for f in browser.find_elements(By.CSS_SELECTOR, "#step-body .formula")]
    assert [f.split(":")[0] for f in formulas] == ["scores", "softmax", "weighted sum"]
    assert "softmax(s)_j = exp(s_j − max s)" in formulas[1]
    headers = [th.text for th in browser.find_elements(By.CSS_SELECTOR, "#step-table th")]
    assert "softmax α_j" in headers
