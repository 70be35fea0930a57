"""A worker killed with SIGKILL mid-step loses no work and duplicates no effect."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path

import asyncpg

from cyclone.testing.plugin import CycloneEnv
from tests.e2e.worker_app import charge

ROOT = Path(__file__).resolve().parents[2]


async def start_worker(dsn: str, lease: float) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tests.e2e.worker_app",
        dsn,
        str(lease),
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )


async def test_sigkill_mid_step_is_reclaimed_and_completes_once(cyclone_env: CycloneEnv) -> None:
    await cyclone_env.pool.execute(
        "CREATE TABLE charges (order_id int, attempt int);"
        "CREATE TABLE started (order_id int, attempt int)"
    )
    started_attempts: asyncio.Queue[str] = asyncio.Queue()
    listener = await asyncpg.connect(cyclone_env.dsn)
    await listener.add_listener(
        "e2e_started", lambda *args: started_attempts.put_nowait(str(args[-1]))
    )
    run = await charge.enqueue(cyclone_env.client, 7)
    doomed = await start_worker(cyclone_env.dsn, lease=1.0)
    try:
        assert await asyncio.wait_for(started_attempts.get(), 60) == "1"
        doomed.send_signal(signal.SIGKILL)
        assert await doomed.wait() == -signal.SIGKILL
    finally:
        if doomed.returncode is None:
            doomed.kill()
    rescuer = await start_worker(cyclone_env.dsn, lease=30.0)
    try:
        assert await run.result(timeout=60) == "charged 7"  # type: ignore[attr-defined]
    finally:
        rescuer.send_signal(signal.SIGTERM)
        rescuer.kill()
        await rescuer.wait()
        await listener.close()
    started = await cyclone_env.pool.fetch("SELECT attempt FROM started ORDER BY attempt")
    assert [r["attempt"] for r in started] == [1, 2]
    charges = await cyclone_env.pool.fetch("SELECT order_id, attempt FROM charges")
    assert [tuple(r) for r in charges] == [(7, 2)]  # attempt 1's write died with it
    errors = (await run.info()).nodes[0].errors
    assert [e["type"] for e in errors] == ["LeaseExpired"]
