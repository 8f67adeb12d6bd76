"""The headless browser the explorer's tests drive (tests/insight/test_explorer_browser.py, insight/test_explorer_text_view.py):
Chromium through Selenium, one per test module, opening pages straight from disk (file://). Skipped, saying
why, only where no Chromium or chromedriver is installed (`.ci/run` installs Debian's `chromium` and
`chromium-driver`)."""
from __future__ import annotations

import shutil

import pytest

CHROMIUM = next((p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome")) if p), None)
CHROMEDRIVER = shutil.which("chromedriver")


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


def open_page(driver, path):
    from selenium.webdriver.support.ui import WebDriverWait
    driver.get(path.resolve().as_uri())
    WebDriverWait(driver, 20).until(lambda d: d.execute_script(
        "return document.documentElement.dataset.detail === '1' || !!(window.attnExplorer && window.attnExplorer.error)"))
    assert driver.execute_script("return window.attnExplorer.error || null") is None
