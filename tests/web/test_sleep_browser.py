"""A sleeping node on the dashboard's run page, in a real headless Chromium: its state, its
wake time and a countdown that ticks in the browser; when the node wakes, the page shows it
completed without a reload. (The browser and the served dashboard: test_browser.py.)"""

from __future__ import annotations

from pathlib import Path

from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.ui import WebDriverWait

import cyclone
from cyclone.testing.plugin import TEST_WORKER_OPTIONS
from tests.web.test_browser import (  # noqa: F401 (fixtures)
    WAIT,
    Served,
    browser,
    served,
    shots,
    text_of,
    wait_text,
)

dozing = cyclone.define("web.dozing", int)
dozing.sleep("nap", sleep=3600)
napping = cyclone.define("web.napping", int)
napping.sleep("nap", sleep=15)  # longer than the page's fallback refresh

NAP = 'tr.node-row[data-node="nap"]'


def test_a_sleeping_node_counts_down_and_wakes_live(
    served: Served,  # noqa: F811
    browser: WebDriver,  # noqa: F811
    shots: Path,  # noqa: F811
) -> None:
    worker = cyclone.Worker(served.client, workflows=[dozing, napping], **TEST_WORKER_OPTIONS)
    served.call(worker.start())
    try:
        long = served.call(dozing.submit(served.client, 1))
        browser.get(f"{served.url}/runs/{long.id}")
        wait_text(browser, f"{NAP} .state", "sleeping")
        countdown = browser.find_element(By.CSS_SELECTOR, f"{NAP} .countdown")
        assert "wakes at" in str(countdown.get_attribute("title"))
        wait_text(browser, f"{NAP} .countdown", "wakes in 59 min")
        first = countdown.text
        # It ticks in the browser, with no request to the server.
        WebDriverWait(browser, WAIT).until(lambda d: text_of(d, f"{NAP} .countdown") != first)
        [reason] = browser.find_elements(By.CSS_SELECTOR, '.reason[data-code="sleeping"]')
        assert "Sleeping until" in reason.text
        browser.save_screenshot(str(shots / "sleeping.png"))

        short = served.call(napping.submit(served.client, 2))
        browser.get(f"{served.url}/runs/{short.id}")
        wait_text(browser, f"{NAP} .state", "sleeping")
        wait_text(browser, f"{NAP} .countdown", "wakes in")
        browser.execute_script("window.notReloaded = true")
        # Woken by the worker's timer; the page follows live, with no reload.
        wait_text(browser, f"{NAP} .state", "completed")
        wait_text(browser, "#run-state", "completed")
        assert browser.execute_script("return window.notReloaded") is True
        assert served.call(short.status()) is cyclone.RunState.COMPLETED
    finally:
        served.call(worker.stop())
