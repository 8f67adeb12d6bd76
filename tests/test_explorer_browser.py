"""The explorer in a real browser: headless Chromium through Selenium opens the page that
sample.py's dump writes, straight from disk (file://), and the tests check what it draws against attn.npz.

One browser for the module. Skipped, saying why, only where no Chromium or chromedriver is installed
(`.ci/run` installs Debian's `chromium` and `chromium-driver`).
"""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch

from insight.dump import dump_internals
from insight.explorer import write_explorer
from insight.explorer.pack import dequantise_rows, quantise_rows
from tests.test_explorer import ids, lively_model

CHROMIUM = next((p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome")) if p), None)
CHROMEDRIVER = shutil.which("chromedriver")
SELECTED = {0: [0, 1, 2, 3], 1: [1, 3]}
T = 24


@pytest.fixture(scope="module")
def browser():
    if CHROMIUM is None or CHROMEDRIVER is None:
        pytest.skip("no headless browser here: install chromium and chromium-driver (Debian) to run these tests")
    webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed (pip install -e '.[test]')")
    from selenium.webdriver.chrome.service import Service
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1400,1000",
                "--no-first-run", "--disable-background-networking", "--disable-component-update"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"performance": "ALL", "browser": "ALL"})
    # explicit paths: Selenium Manager would otherwise look for (and try to download) a driver
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    yield driver
    driver.quit()


@pytest.fixture(scope="module")
def dumped(tmp_path_factory):
    """What sample.py --dump-attn writes for a GQA model (heads 0,1 share a kv head) with lively weights."""
    model = lively_model(seed=11, n_kv_head=2)
    idx = ids(T, seed=12)
    internals = model.attention_internals(idx)
    out = tmp_path_factory.mktemp("dump")
    tokens = [f"t{i}" for i in idx[0].tolist()]
    dump_internals(internals, SELECTED, tokens, out, token_ids=idx[0].tolist())
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


def open_page(driver, path):
    from selenium.webdriver.support.ui import WebDriverWait
    driver.get(path.resolve().as_uri())
    WebDriverWait(driver, 20).until(lambda d: d.execute_script(
        "return document.documentElement.dataset.detail === '1' || !!(window.attnExplorer && window.attnExplorer.error)"))
    assert driver.execute_script("return window.attnExplorer.error || null") is None


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
        [+r.dataset.layer, +r.dataset.head, +r.children[2].dataset.value])""")
    assert len(rows) == 8 and [r[2] for r in rows] == sorted(r[2] for r in rows)
    from insight.stats import head_stats
    for layer, head, entropy in rows:
        assert entropy == pytest.approx(head_stats(npz[f"layer_{layer}"])["entropy"][head], abs=1e-9)


def test_a_head_without_stored_q_k_v_says_how_to_get_them(browser, dumped, tmp_path):
    from selenium.webdriver.common.by import By
    _, _, internals, tokens = dumped
    page = write_explorer(tmp_path / "small.html", internals, tokens, max_bytes=1)  # room for the weights only
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
    browser.find_element(By.ID, "tab-model").click()
    browser.find_element(By.ID, "thumb-0-1").click()
    browser.find_element(By.ID, "tab-stats").click()
    requests = [json.loads(entry["message"])["message"] for entry in browser.get_log("performance")]
    urls = [m["params"]["request"]["url"] for m in requests if m["method"] == "Network.requestWillBeSent"]
    assert urls == [page.resolve().as_uri()], urls
    assert browser.execute_script("return performance.getEntriesByType('resource').length") == 0
    errors = [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
    assert not errors, errors
