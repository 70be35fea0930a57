"""``cyclone worker --metrics-port`` in a real subprocess serves /metrics over HTTP."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import sys
import urllib.request
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from cyclone.testing.plugin import CycloneEnv
from tests.cli.app import echo
from tests.conftest import ROOT, reaped

SCRIPT = str(Path(sys.executable).parent / "cyclone")


def fetch(url: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    with urllib.request.urlopen(url, timeout=30) as response:
        text = response.read().decode()
    return {
        f.name: [(s.labels, s.value) for s in f.samples]
        for f in text_string_to_metric_families(text)
    }


async def test_worker_serves_metrics(cyclone_env: CycloneEnv) -> None:
    proc = await asyncio.create_subprocess_exec(
        SCRIPT,
        "--dsn",
        cyclone_env.dsn,
        "worker",
        "tests.cli.app:echo",
        "--poll-interval",
        "0.1",
        "--metrics-port",
        "0",  # a free port, printed on stderr
        "--queue-metrics",
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stderr=asyncio.subprocess.PIPE,
    )
    async with reaped(proc):
        assert proc.stderr is not None
        url = None
        while url is None:
            line = (await asyncio.wait_for(proc.stderr.readline(), 60)).decode()
            assert line, "the worker exited before serving metrics"
            found = re.search(r"metrics on (http://127\.0\.0\.1:\d+/metrics)", line)
            url = found[1] if found else None
        run = await echo.enqueue(cyclone_env.client, 5)
        assert await run.result(timeout=60) == 5
        metrics = await asyncio.to_thread(fetch, url)
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), 60) == 0
    assert ({"kind": "cli.echo", "queue": "cli"}, 1.0) in metrics["cyclone_completed"]
    assert ({"queue": "cli"}, 1.0) in metrics["cyclone_queue_workers"]
    assert ({}, 1.0) in metrics["cyclone_queue_stats_up"]
