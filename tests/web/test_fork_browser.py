"""The fork button in a real headless Chromium: a failed run forked from its failed node opens
the fork's page, which completes live and links back; the source links to its fork."""

from __future__ import annotations

from pathlib import Path

import cyclone
from tests.web.flows import FAILING, HOSTILE, pipeline
from tests.web.test_browser import (  # the browser, the served dashboard and their helpers
    WAIT,
    By,
    Served,
    WebDriver,
    browser,  # noqa: F401
    served,  # noqa: F401
    shots,  # noqa: F401
    text_of,
    wait_text,
)


def test_fork_button(served: Served, browser: WebDriver, shots: Path) -> None:  # noqa: F811
    FAILING["charge"] = True
    failed = served.call(pipeline.submit(served.client, {"id": 7, "note": HOSTILE}))
    assert served.call(failed.wait(timeout=WAIT)) is cyclone.RunState.FAILED
    browser.get(f"{served.url}/runs/{failed.id}")
    wait_text(browser, "#run-state", "failed")
    FAILING["charge"] = False  # the fix is deployed
    browser.find_element(By.CSS_SELECTOR, 'tr[data-node="web.charge"] button.fork').click()
    wait_text(browser, "#forked-from", str(failed.id))  # the fork's page
    wait_text(browser, "#run-state", "completed")
    assert text_of(browser, "#run-output") == '"shipped"'
    browser.save_screenshot(str(shots / "run-forked.png"))
    fork_id = browser.current_url.rpartition("/")[2]
    [(forked, node)] = served.call(failed.info()).forks
    assert (str(forked), node) == (fork_id, "web.charge")
    browser.find_element(By.ID, "forked-from").click()
    wait_text(browser, "#forks", fork_id)  # the source links to its fork
    assert served.call(failed.status()) is cyclone.RunState.FAILED
