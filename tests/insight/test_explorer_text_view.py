"""The explorer's text view in a real browser (tests/explorer_browser.py): a long prompt opens on it, each
earlier token shaded by its weight, the value-weighted toggle, pinning, keys, the statistics row that opens a
head there, and a char-level prompt's words."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from data.tokenizer import CharTokenizer
from insight.dump import dump_internals, prompt_head_scores
from insight.explorer import HeadScores, write_explorer
from insight.explorer.pack import dequantise_rows, quantise_rows
from tests.explorer_browser import browser, open_page  # noqa: F401 (browser: a fixture)
from tests.insight.test_explorer import CHARS, ids, lively_model


LONG = 60


@pytest.fixture(scope="module")
def long_page(tmp_path_factory):
    """A 60-token prompt, with a newline and spaces among its tokens: the page opens on the text view."""
    model = lively_model(seed=13, block_size=64, n_kv_head=2)
    idx = ids(LONG, seed=14)
    internals = model.attention_internals(idx)
    out = tmp_path_factory.mktemp("long")
    tokens = [CHARS[t] + ("" if i % 3 else "x") for i, t in enumerate(idx[0].tolist())]
    tokens[10] = "\n"
    scores, note = prompt_head_scores(model, idx, CharTokenizer(CHARS))
    dump_internals(internals, {0: [0], 1: [1]}, tokens, out, token_ids=idx[0].tolist(),
                   scores=HeadScores(scores, note))
    with np.load(out / "attn.npz") as npz:
        arrays = {name: npz[name] for name in npz.files}
    return out / "attention.html", arrays, tokens


def shading(driver) -> list[dict]:
    return driver.execute_script("""return Array.from(document.querySelectorAll('#text-body .ttok'), t => ({
        index: +t.dataset.index, alpha: t.dataset.alpha === undefined ? null : +t.dataset.alpha,
        shade: t.dataset.shade === undefined ? null : +t.dataset.shade, background: t.style.backgroundColor,
        after: t.classList.contains('after'), query: t.classList.contains('q'), text: t.textContent}))""")


def background_alpha(css: str) -> float:
    """The opacity of an inline 'rgba(r, g, b, a)' (Chrome writes rgb(...) for a = 1)."""
    inside = css[css.index("(") + 1:-1].split(",")
    return float(inside[3]) if len(inside) == 4 else 1.0


def top_list(driver) -> list[tuple[int, float]]:
    return driver.execute_script("""return Array.from(document.querySelectorAll('#text-top .top-item'), e =>
        [+e.dataset.key, +e.dataset.value])""")


def test_text_view_opens_first_with_the_last_query_in_sight(browser, long_page):
    from selenium.webdriver.common.by import By
    page, _, tokens = long_page
    open_page(browser, page)
    assert browser.find_element(By.ID, "tab-text").get_attribute("class") == "tab active"
    assert browser.find_element(By.ID, "pane-text").is_displayed()
    assert not browser.find_element(By.ID, "pane-head").is_displayed()
    spans = shading(browser)
    assert [s["text"] for s in spans[:12]] == [t if t != "\n" else "↵\n" for t in tokens[:12]]  # running text
    last = browser.find_element(By.ID, f"t-tok-{LONG - 1}")
    assert "q" in last.get_attribute("class").split() and last.is_displayed()
    inside = browser.execute_script("""const t = arguments[0].getBoundingClientRect(),
        b = document.getElementById('text-body').getBoundingClientRect();
        return t.top >= b.top && t.bottom <= b.bottom && t.bottom <= window.innerHeight""", last)
    assert inside
    # the head view, 60 rows of 18 px in a box shorter than that: scrolled so the query shows
    browser.find_element(By.ID, "tab-head").click()
    seen = browser.execute_script("""const t = document.getElementById('q-tok-59').getBoundingClientRect(),
        s = document.getElementById('head-scroll'), b = s.getBoundingClientRect();
        return [s.scrollHeight > s.clientHeight, t.top >= b.top && t.bottom <= b.bottom]""")
    assert seen == [True, True]


def test_text_view_shades_each_earlier_token_by_its_weight(browser, long_page):
    """Pointing at query i shades token j <= i by exactly alpha_ij (its 8-bit value; the inline background's
    opacity), leaves later tokens unshaded, and lists the largest weights in order, the rest as "others"."""
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select
    page, npz, _ = long_page
    open_page(browser, page)
    Select(browser.find_element(By.ID, "text-layer")).select_by_value("1")
    Select(browser.find_element(By.ID, "text-layer")).select_by_value("0")  # back: the layer menu works both ways
    Select(browser.find_element(By.ID, "text-head")).select_by_value("3")
    i = 41
    ActionChains(browser).move_to_element(browser.find_element(By.ID, f"t-tok-{i}")).perform()
    w = npz["layer_0"][3, i]  # (LONG,)
    step = float(w.max()) / 510
    spans = shading(browser)
    assert [s["index"] for s in spans if s["query"]] == [i]
    for s in spans:
        j = s["index"]
        if j <= i:
            assert abs(s["alpha"] - w[j]) <= step * (1 + 1e-4) + 1e-7, s
            assert s["shade"] == pytest.approx(s["alpha"], abs=1e-12)
            # what one sees: the inline background at that opacity (Chrome keeps it to 1/255)
            assert background_alpha(s["background"]) == pytest.approx(s["alpha"], abs=1 / 255)
            assert not s["after"]
        else:
            assert s["alpha"] is None and s["background"] == "" and s["after"]
    assert np.ptp(w[:i + 1]) > 0.1  # peaked: the shading differs from token to token
    listed = top_list(browser)
    shown = dequantise_rows(*quantise_rows(npz["layer_0"]))[3, i]  # the page's 8-bit weights: ties as it sees them
    expected = sorted(range(i + 1), key=lambda j: (-shown[j], j))[:5]
    assert [k for k, _ in listed] == expected
    assert [v for _, v in listed] == sorted((v for _, v in listed), reverse=True)
    for k, v in listed:
        assert abs(v - w[k]) <= step * (1 + 1e-4) + 1e-7
    others = float(browser.find_element(By.CSS_SELECTOR, "#text-top .others").get_attribute("data-value"))
    assert others == pytest.approx(1.0 - sum(v for _, v in listed), abs=(i + 1) * step)
    text = browser.find_element(By.ID, "text-top").text
    assert text.startswith(f'"{npz["tokens"][i].strip()}" → ') and text.split(" → ")[1].startswith('"')


def test_text_view_value_weighted_pin_and_keys(browser, long_page):
    """The toggle shades by alpha_ij ||v_j W_O^h|| over the row's largest; a click pins the query (leaving
    the text keeps it), ←/→ move it, and the step-by-step view follows the pinned query."""
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    page, npz, _ = long_page
    open_page(browser, page)
    i = 30
    browser.find_element(By.ID, f"t-tok-{i}").click()
    ActionChains(browser).move_to_element(browser.find_element(By.ID, "text-hint")).perform()  # off the tokens
    assert [s["index"] for s in shading(browser) if s["query"]] == [i]
    assert browser.find_element(By.ID, "step-query").get_attribute("value") == str(i)
    browser.find_element(By.ID, "text-vw").click()
    layer, head = 0, 0  # what the page opened on: layer 0's selected head
    vw = npz[f"value_weighted_{layer}"][head, i, :i + 1]
    norms = npz[f"value_norm_{layer}"][head]
    step = npz[f"layer_{layer}"][head, i].max() / 510
    spans = [s for s in shading(browser) if s["index"] <= i]
    top = max(s["alpha"] * norms[s["index"]] for s in spans)
    for s in spans:
        j = s["index"]
        assert abs(s["shade"] * top - vw[j]) <= step * norms[j] * (1 + 1e-4) + 1e-6
    shown = dequantise_rows(*quantise_rows(npz[f"layer_{layer}"]))[head, i, :i + 1] * norms[:i + 1]
    assert [k for k, _ in top_list(browser)] == sorted(range(i + 1), key=lambda j: (-shown[j], j))[:5]
    assert max(abs(s["shade"] - s["alpha"]) for s in spans) > 0.05  # not the plain weights' shading
    browser.find_element(By.ID, "text-vw").click()
    browser.find_element(By.TAG_NAME, "body").send_keys(Keys.ARROW_LEFT)
    browser.find_element(By.TAG_NAME, "body").send_keys(Keys.ARROW_LEFT)
    assert [s["index"] for s in shading(browser) if s["query"]] == [i - 2]
    assert browser.find_element(By.ID, "step-query").get_attribute("value") == str(i - 2)
    browser.find_element(By.TAG_NAME, "body").send_keys(Keys.ARROW_RIGHT)
    assert [s["index"] for s in shading(browser) if s["query"]] == [i - 1]


def test_a_long_prompts_statistics_row_opens_the_head_in_the_text_view(browser, long_page):
    from selenium.webdriver.common.by import By
    page, npz, _ = long_page
    open_page(browser, page)
    browser.find_element(By.ID, "tab-stats").click()
    browser.find_element(By.CSS_SELECTOR, "#stats-table tr[data-layer='1'][data-head='2']").click()
    assert browser.find_element(By.ID, "pane-text").is_displayed()
    assert browser.find_element(By.ID, "text-layer").get_attribute("value") == "1"
    assert browser.find_element(By.ID, "text-head").get_attribute("value") == "2"
    w = npz["layer_1"][2, LONG - 1]
    alphas = [s["alpha"] for s in shading(browser)]
    np.testing.assert_allclose(alphas, w, atol=w.max() / 510 * 1.0001 + 1e-7)


def test_char_level_text_view_names_the_word_of_each_letter(browser, tmp_path):
    """In a char-level prompt the list says which word a letter is in, or which word a space comes before."""
    from selenium.webdriver.common.by import By
    text = "the cat sat on\nthe mat"
    model = lively_model(seed=15)
    idx = torch.tensor([[CHARS.index(c) for c in text]])
    page = write_explorer(tmp_path / "chars.html", model.attention_internals(idx), list(text))
    open_page(browser, page)
    assert browser.find_element(By.ID, "pane-text").is_displayed()  # char-level: the text view first
    items = browser.execute_script("""return Array.from(document.querySelectorAll('#text-top .top-item'), e =>
        [+e.dataset.key, e.textContent])""")
    words = {**{j: f"(in {w})" for w, start in (("the", 0), ("cat", 4), ("sat", 8), ("on", 12), ("the", 15), ("mat", 19))
                for j in range(start, start + len(w))},
             **{3: "(before cat)", 7: "(before sat)", 11: "(before on)", 14: "(before the)", 18: "(before mat)"}}
    assert len(items) == 5
    for key, shown in items:
        assert words[key] in shown, (key, shown)
    assert browser.find_element(By.ID, "text-top").text.startswith('"t" (in mat) → ')
    assert browser.find_element(By.ID, "t-tok-14").text == "↵"  # the newline, then a line break
