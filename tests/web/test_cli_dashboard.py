"""``cyclone dashboard``: serves the dashboard with uvicorn until SIGINT; read-only off
loopback; a bad --bind is a one-line error."""

from __future__ import annotations

import asyncio
import os
import signal
import socket

import httpx

from cyclone.testing.plugin import CycloneEnv
from tests.cli.test_cli import SCRIPT, cli, one_line_error
from tests.conftest import ROOT, reaped
from tests.web.conftest import failed_run


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


async def test_serves_until_interrupted(cyclone_env: CycloneEnv) -> None:
    run_id = await failed_run(cyclone_env)
    port = free_port()
    proc = await asyncio.create_subprocess_exec(
        SCRIPT,
        "--dsn",
        cyclone_env.dsn,
        "dashboard",
        "--bind",
        f"127.0.0.1:{port}",
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stderr=asyncio.subprocess.PIPE,
    )
    async with reaped(proc):
        assert proc.stderr is not None
        line = await asyncio.wait_for(proc.stderr.readline(), 60)
        assert f"dashboard on http://127.0.0.1:{port}/" in line.decode()
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as http:
            page = await http.get(f"/runs/{run_id}")
            assert page.status_code == 200 and 'id="retry-all"' in page.text  # loopback
        proc.send_signal(signal.SIGINT)
        assert await asyncio.wait_for(proc.wait(), 60) == 0


async def test_bad_bind_is_one_line(cyclone_env: CycloneEnv) -> None:
    code, _, err = await cli("dashboard", "--bind", "nowhere", dsn=cyclone_env.dsn)
    assert one_line_error(code, err) == (
        "cyclone: --bind 'nowhere' is not HOST:PORT, e.g. 127.0.0.1:8080"
    )
