"""Exactly one run per slot across worker processes, one of them SIGKILLed and restarted.

CYCLONE_SCHEDULE_E2E_SECONDS shortens the 30 s observation for local runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import os
import signal
from collections import Counter

import cyclone
from cyclone._model.schedules import slot_key
from cyclone.testing.plugin import CycloneEnv
from tests.conftest import python_module, reaped

SECONDS = float(os.environ.get("CYCLONE_SCHEDULE_E2E_SECONDS", "30"))
NAME = "e2e.every-second"


async def start(dsn: str) -> asyncio.subprocess.Process:
    return await python_module("tests.schedules.schedule_app", dsn)


async def slot_keys(env: CycloneEnv) -> list[str]:
    rows = await env.pool.fetch(
        "SELECT key FROM cyclone_runs WHERE name = 'sched.e2e.tick' ORDER BY key"
    )
    return [r["key"] for r in rows]


async def wait_for_runs(env: CycloneEnv, count: int) -> None:
    """Poll: the runs come from other processes, which no event here reports."""
    async with asyncio.timeout(120):
        while True:
            if len(await slot_keys(env)) >= count:
                return
            await asyncio.sleep(0.2)


async def test_four_processes_make_exactly_one_run_per_slot(cyclone_env: CycloneEnv) -> None:
    dsn = cyclone_env.dsn
    async with contextlib.AsyncExitStack() as stack:
        procs = [await stack.enter_async_context(reaped(await start(dsn))) for _ in range(4)]
        await wait_for_runs(cyclone_env, 2)  # every process is up and one fired
        first = (await cyclone_env.client.schedules.get(NAME)).last_slot
        assert first is not None
        await asyncio.sleep(SECONDS / 2)
        procs[0].send_signal(signal.SIGKILL)
        assert await procs[0].wait() == -signal.SIGKILL
        await stack.enter_async_context(reaped(await start(dsn)))
        await asyncio.sleep(SECONDS / 2)
        for proc in procs[1:]:
            proc.send_signal(signal.SIGTERM)
        await asyncio.gather(*(p.wait() for p in procs[1:]))
    keys = await slot_keys(cyclone_env)
    dupes = [k for k, n in Counter(keys).items() if n > 1]
    assert dupes == []
    info = await cyclone_env.client.schedules.get(NAME)
    assert info.last_slot is not None
    seconds = int((info.last_slot - first).total_seconds())
    expected = [slot_key(NAME, first + dt.timedelta(seconds=i)) for i in range(seconds + 1)]
    made = [k for k in keys if k >= expected[0]]
    assert made == expected  # no gap from the first observed slot to the last
    assert seconds >= SECONDS * 0.8
    states = await cyclone_env.pool.fetch(
        "SELECT DISTINCT state FROM cyclone_runs WHERE name = 'sched.e2e.tick'"
    )
    assert {r["state"] for r in states} <= {"completed", "pending"}
    assert cyclone.RunState.COMPLETED.value in {r["state"] for r in states}
