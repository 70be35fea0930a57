"""The dashboard in a real headless Chromium (Selenium), served by uvicorn on 127.0.0.1 over a
real database with a worker: overview, filtering, a failed workflow's traceback, retry_all
completing live without a reload, cancelling a running run, a hostile payload shown as text;
and, measured at 1280x800, runs one line each and a failed run's summary.

Screenshots of each page go to ``$CYCLONE_ARTIFACTS/dashboard`` (else a temp folder); the
test prints where. Without Chromium it skips, except in CI (``CI`` set), where it must run.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import tempfile
import threading
import uuid
from collections.abc import Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

import asyncpg
import pytest
import uvicorn

import cyclone
import cyclone.web
from cyclone.testing.plugin import TEST_WORKER_OPTIONS, DatabaseFactory
from tests.web.flows import (
    FAILING,
    HOSTILE,
    PROGRESS_GATE,
    STEPS,
    WORKFLOWS,
    approval,
    echo,
    forever,
    pipeline,
    progressing,
)

CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
WAIT = 90.0  # seconds; the machine may be busy
T = TypeVar("T")

if not (Path(CHROMIUM).exists() and Path(CHROMEDRIVER).exists()):
    if os.environ.get("CI"):
        raise RuntimeError(f"CI must run the browser tests: install chromium ({CHROMIUM})")
    pytest.skip(
        "no Chromium: apt-get install chromium chromium-driver (CI installs them)",
        allow_module_level=True,
    )

from selenium import webdriver  # noqa: E402
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.remote.webdriver import WebDriver  # noqa: E402
from selenium.webdriver.support import expected_conditions as ec  # noqa: E402
from selenium.webdriver.support.ui import Select, WebDriverWait  # noqa: E402


class Served:
    """A pool, client, worker and the dashboard under uvicorn, on a loop in a thread (the
    browser calls block, so they cannot share the server's loop)."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.call(self._start())

    def call(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout=WAIT)

    async def _start(self) -> None:
        self.pool = await asyncpg.create_pool(self.dsn, min_size=1, max_size=8)
        self.client = cyclone.Client(self.pool)
        self.worker = cyclone.Worker(
            self.client, steps=STEPS, workflows=WORKFLOWS, **TEST_WORKER_OPTIONS
        )
        await self.worker.start()
        config = uvicorn.Config(
            cyclone.web.dashboard(self.client),
            log_level="warning",
            lifespan="off",
            timeout_graceful_shutdown=2,
        )
        # Listening before uvicorn starts: the browser's first request waits in the backlog.
        sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        self.server = uvicorn.Server(config)
        self.serving = asyncio.get_running_loop().create_task(self.server.serve([sock]))

    async def _stop(self) -> None:
        self.server.should_exit = True
        await self.serving
        await self.worker.stop()
        await self.client.aclose()
        await self.pool.close()

    def close(self) -> None:
        self.call(self._stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=WAIT)
        self.loop.close()


@pytest.fixture
def served(cyclone_databases: DatabaseFactory) -> Iterator[Served]:
    dsn = asyncio.run(cyclone_databases.create())
    stack = Served(dsn)
    try:
        yield stack
    finally:
        stack.close()
        asyncio.run(cyclone_databases.drop(dsn))


@pytest.fixture
def browser() -> Iterator[WebDriver]:
    profile = tempfile.mkdtemp(prefix="cyclone-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        f"--user-data-dir={profile}",
        "--window-size=1280,900",
    ):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(WAIT)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


@pytest.fixture
def shots(capsys: pytest.CaptureFixture[str]) -> Path:
    root = os.environ.get("CYCLONE_ARTIFACTS")
    folder = (
        Path(root) / "dashboard"
        if root
        else Path(tempfile.mkdtemp(prefix="cyclone-dashboard-shots-"))
    )
    folder.mkdir(parents=True, exist_ok=True)
    with capsys.disabled():
        print(f"\ndashboard screenshots: {folder}")
    return folder


def text_of(driver: WebDriver, css: str) -> str:
    return str(driver.find_element(By.CSS_SELECTOR, css).text)


def wait_text(driver: WebDriver, css: str, expected: str) -> None:
    WebDriverWait(driver, WAIT).until(
        ec.text_to_be_present_in_element((By.CSS_SELECTOR, css), expected)
    )


def test_operator_walkthrough(served: Served, browser: WebDriver, shots: Path) -> None:
    FAILING["charge"] = True
    failed = served.call(pipeline.submit(served.client, {"id": 1, "note": HOSTILE}))
    assert served.call(failed.wait(timeout=WAIT)) is cyclone.RunState.FAILED
    served.call(echo.enqueue_many(served.client, list(range(3))))

    # The overview: queues with their counts and throughput; the page goes live (SSE).
    browser.get(served.url + "/")
    wait_text(browser, "#live-status", "live")
    WebDriverWait(browser, WAIT).until(
        ec.presence_of_element_located((By.CSS_SELECTOR, 'tr[data-queue="payments"]'))
    )
    assert "1 failed" in text_of(browser, 'tr[data-queue="payments"]')
    browser.save_screenshot(str(shots / "overview.png"))

    # Filter the runs to the failed ones.
    browser.get(served.url + "/runs")
    Select(browser.find_element(By.NAME, "state")).select_by_value("failed")
    browser.find_element(By.ID, "apply").click()
    WebDriverWait(browser, WAIT).until(ec.url_contains("state=failed"))
    rows = browser.find_elements(By.CSS_SELECTOR, "tr[data-run]")
    assert [r.get_attribute("data-run") for r in rows] == [str(failed.id)]
    assert HOSTILE in text_of(browser, f'tr[data-run="{failed.id}"] td.message')
    browser.save_screenshot(str(shots / "runs.png"))

    # Open the failed run: the failed node's traceback, the hostile text as text.
    browser.find_element(By.CSS_SELECTOR, f'a[title="{failed.id}"]').click()
    wait_text(browser, "#run-state", "failed")
    traceback = text_of(browser, 'tr.detail[data-node="web.charge"] pre.traceback')
    assert "Traceback (most recent call last)" in traceback
    assert f"ValueError: card declined {HOSTILE}" in traceback
    assert browser.title != "pwned"
    assert not browser.find_elements(By.CSS_SELECTOR, "#live b")  # no markup from data
    assert json.dumps(HOSTILE) in text_of(browser, "#run-input")
    browser.save_screenshot(str(shots / "run-failed.png"))

    # retry_all, and watch it complete without a reload.
    browser.execute_script("window.cycloneMarker = 'same page';")
    FAILING["charge"] = False
    browser.find_element(By.ID, "retry-all").click()
    wait_text(browser, "#run-state", "completed")
    assert browser.execute_script("return window.cycloneMarker;") == "same page"
    assert text_of(browser, "#run-output") == '"shipped"'
    browser.save_screenshot(str(shots / "run-completed.png"))

    # Cancel a running run.
    running = served.call(forever.enqueue(served.client, None))
    browser.get(f"{served.url}/runs/{running.id}")
    wait_text(browser, "#run-state", "running")
    browser.find_element(By.ID, "cancel").click()
    wait_text(browser, "#run-state", "cancelled")
    assert served.call(running.status()) is cyclone.RunState.CANCELLED
    assert not browser.find_elements(By.ID, "cancel")  # a cancelled run offers no action
    browser.save_screenshot(str(shots / "run-cancelled.png"))

    # Signal a wait node: the form lives in the refreshed part; the run completes live.
    waiting = served.call(approval.submit(served.client, {"id": 3}))
    browser.get(f"{served.url}/runs/{waiting.id}")
    payload = browser.find_element(By.NAME, "payload")
    payload.clear()
    payload.send_keys('{"by": "ops"}')
    browser.find_element(By.ID, "signal").click()
    wait_text(browser, "#run-state", "completed")
    assert not browser.find_elements(By.ID, "signal")  # a completed run takes no signal
    assert served.call(waiting.payloads()).nodes["approve"].signal == {"by": "ops"}

    # A run id that does not exist: the 404 page.
    browser.get(f"{served.url}/runs/{uuid.uuid4()}")
    assert "not found" in text_of(browser, "#message")


async def _new_gate() -> asyncio.Event:
    return asyncio.Event()  # made on the served loop, where the step waits for it


def test_a_running_steps_progress_bar_and_stream(
    served: Served, browser: WebDriver, shots: Path
) -> None:
    gate = PROGRESS_GATE["gate"] = served.call(_new_gate())
    run = served.call(progressing.enqueue(served.client, 3))
    browser.get(f"{served.url}/runs/{run.id}")
    bar = '#progress-bars .bar[data-node="web.progress"]'
    wait_text(browser, f"{bar} .value", "50%")
    assert browser.find_element(By.CSS_SELECTOR, f"{bar} progress").get_property("value") == 0.5
    wait_text(browser, '#stream-items li[data-offset="3"]', '{"line":2}')
    lines = browser.find_elements(By.CSS_SELECTOR, "#stream-items li")
    assert [li.get_attribute("data-offset") for li in lines] == ["1", "2", "3"]
    wait_text(browser, "#stream-status", "live")
    browser.save_screenshot(str(shots / "run-progress.png"))
    served.loop.call_soon_threadsafe(gate.set)
    wait_text(browser, f"{bar} .value", "100%")  # the last report, without a reload
    wait_text(browser, "#stream-status", "run ended")
    wait_text(browser, "#run-state", "completed")
    assert browser.find_element(By.CSS_SELECTOR, f"{bar} progress").get_property("value") == 1


ROW_MAX_PX = 32
"""The tallest a row of the runs list may be: one line of text and its padding."""
ROWS_MIN = 20
"""Rows of the runs list that fit in a 1280x800 window under the filters, at the least."""

MEASURE_ROWS = """
const rows = [...document.querySelectorAll("tr[data-run]")];
const lines = [...document.querySelectorAll("tr[data-run] time, tr[data-run] td.id a")];
return {
  viewport: [window.innerWidth, window.innerHeight],
  heights: rows.map(r => r.getBoundingClientRect().height),
  visible: rows.filter(r => r.getBoundingClientRect().bottom <= window.innerHeight).length,
  wrapped: lines.filter(e => e.getClientRects().length !== 1).map(e => e.outerHTML),
  overflow: document.documentElement.scrollWidth > window.innerWidth,
};
"""

PLACEHOLDER = """
const input = document.querySelector("input[name=after]");
return [getComputedStyle(input).color, getComputedStyle(input, "::placeholder").color,
        getComputedStyle(input, "::placeholder").fontStyle];
"""


def test_runs_fit_one_line_each_and_a_failure_reads_well(
    served: Served, browser: WebDriver, shots: Path
) -> None:
    FAILING["charge"] = True
    jobs = served.call(echo.enqueue_many(served.client, [{"n": i} for i in range(35)]))
    failed = [
        served.call(pipeline.submit(served.client, {"id": i, "note": HOSTILE * 3}))
        for i in range(4)
    ]
    keyed, _ = served.call(pipeline.submit_once(served.client, "order-2025-000042", {"id": 42}))
    failed.append(keyed)
    for run in [*jobs, *failed]:
        served.call(run.wait(timeout=WAIT))
    # A viewport of 1280x800: the window is larger by its frame.
    frame = browser.execute_script("return window.outerHeight - window.innerHeight;")
    browser.set_window_size(1280, 800 + frame)

    browser.get(served.url + "/runs")
    WebDriverWait(browser, WAIT).until(
        lambda b: len(b.find_elements(By.CSS_SELECTOR, "tr[data-run]")) == 40
    )
    measured = browser.execute_script(MEASURE_ROWS)
    browser.save_screenshot(str(shots / "runs-1280x800.png"))
    assert max(measured["heights"]) <= ROW_MAX_PX, measured["heights"]
    assert measured["visible"] >= ROWS_MIN, measured
    assert measured["wrapped"] == [], measured["wrapped"]  # ids and times on one line
    assert not measured["overflow"]  # no sideways scrolling: long errors end in an ellipsis
    colour, hint, style = browser.execute_script(PLACEHOLDER)
    assert hint != colour and style == "italic"  # the time filter's hint is no value

    # A failed run: the summary names the error, node and attempt; one traceback, under it.
    newest = failed[-2].id
    browser.find_element(By.CSS_SELECTOR, f'a[title="{newest}"]').click()
    wait_text(browser, "#run-state", "failed")
    summary = text_of(browser, "#run-error")
    assert f"ValueError: card declined {HOSTILE}" in summary
    assert "Node web.charge, attempt 1," in summary
    assert len(browser.find_elements(By.CSS_SELECTOR, "pre.traceback")) == 1
    assert browser.find_elements(By.ID, "retry-all") and not browser.find_elements(By.ID, "cancel")
    assert text_of(browser, "#no-output") == "No output: the run failed."
    browser.save_screenshot(str(shots / "run-failed-1280x800.png"))
    browser.find_element(By.LINK_TEXT, "Traceback below").click()
    traceback = browser.find_element(By.CSS_SELECTOR, "pre.traceback")
    assert traceback.is_displayed() and "Traceback (most recent call last)" in traceback.text
