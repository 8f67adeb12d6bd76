"""The README's pictures of the explorer: a page written by `sample.py --dump-attn`, photographed by
headless Chromium (the browser the tests drive) with one view, one layer, some heads and one query chosen.

    python sample.py --prompt "..." --dump-attn all --dump-dir /tmp/dump --max-new-tokens 0
    python docs/explorer_screenshot.py /tmp/dump/attention.html docs/explorer_small.png --layer 1 --heads 0,2 --query 71
    python docs/explorer_screenshot.py /tmp/dump/attention.html docs/explorer_text_view.png --view text --layer 0 --heads 1 --query 44
    python docs/explorer_screenshot.py /tmp/dump/attention.html docs/explorer_statistics.png --view stats --sort-by induction

--view head (the default) switches --heads on in the head view; --view text shows the first of --heads
(or --focus) in the text view, the query pinned; --view stats shows the Statistics tab, sorted by a column
(--sort-by, twice for largest first with --descending).

The PNG is reduced to a 256-colour palette (Pillow, which matplotlib installs) to keep the repository small.
"""
from __future__ import annotations

import argparse
import shutil
import time
from pathlib import Path


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("page", type=Path)
    p.add_argument("png", type=Path)
    p.add_argument("--layer", type=int, default=0)
    p.add_argument("--heads", default="0", help="comma-separated heads switched on in the head view")
    p.add_argument("--query", type=int, default=-1, help="the query token (negative: from the end)")
    p.add_argument("--focus", type=int, help="the head of the step-by-step view (default: the first of --heads)")
    p.add_argument("--value-weighted", action="store_true")
    p.add_argument("--sort", action="store_true", help="the step-by-step rows largest weight first")
    p.add_argument("--size", default="1400,820", help="window width,height in CSS pixels")
    p.add_argument("--view", choices=["head", "text", "stats"], default="head", help="which tab to photograph")
    p.add_argument("--sort-by", help="--view stats: the column to sort by (e.g. induction, ablation_dloss)")
    p.add_argument("--descending", action="store_true", help="--view stats: largest first")
    args = p.parse_args()

    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select
    options = webdriver.ChromeOptions()
    options.binary_location = next(p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome")) if p)
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", f"--window-size={args.size}", "--hide-scrollbars"):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(shutil.which("chromedriver")), options=options)
    try:
        driver.get(args.page.resolve().as_uri())
        while driver.execute_script("return document.documentElement.dataset.detail !== '1'"):
            time.sleep(0.05)
        heads = [int(h) for h in args.heads.split(",")]
        driver.find_element(By.ID, "tab-head").click()
        Select(driver.find_element(By.ID, "layer-select")).select_by_value(str(args.layer))
        n_head, window = driver.execute_script("const m = window.attnExplorer.meta; return [m.n_head, m.window]")
        for h in range(n_head):
            box = driver.find_element(By.ID, f"head-toggle-{h}")
            if box.is_selected() != (h in heads):
                box.click()
        query = args.query % window
        driver.find_element(By.ID, f"q-tok-{query}").click()
        Select(driver.find_element(By.ID, "step-head")).select_by_value(str(args.focus if args.focus is not None else heads[0]))
        for wanted, toggle in ((args.value_weighted, "value-weighted"), (args.sort, "step-sort")):
            if wanted:
                driver.find_element(By.ID, toggle).click()
        # show the chosen query's rows: scroll the head view so the query sits near the bottom
        driver.execute_script("""const s = document.getElementById('head-scroll');
            s.scrollTop = Math.max(0, (arguments[0] + 2) * 18 - s.clientHeight); window.scrollTo(0, 0);""", query)
        if args.view == "text":
            driver.find_element(By.ID, "tab-text").click()
            if args.value_weighted:
                driver.find_element(By.ID, "text-vw").click()
            driver.find_element(By.ID, f"t-tok-{query}").click()
        elif args.view == "stats":
            driver.find_element(By.ID, "tab-stats").click()
            if args.sort_by:
                header = driver.find_element(By.CSS_SELECTOR, f"#stats-table th[data-col='{args.sort_by}']")
                for _ in range(2 if args.descending else 1):
                    header.click()
        driver.find_element(By.TAG_NAME, "h1").click()  # move the pointer off the tokens
        driver.save_screenshot(str(args.png))
    finally:
        driver.quit()
    from PIL import Image
    Image.open(args.png).convert("RGB").quantize(colors=256, method=Image.Quantize.MEDIANCUT).save(args.png, optimize=True)
    print(f"{args.png}: {args.png.stat().st_size / 1024:.0f} KiB")


if __name__ == "__main__":
    main()
