"""A sleeping node survives its worker: SIGKILL the only worker process while the node
sleeps, start a new one, and the run completes after the wake time, the node's wake time
worked out once and the step after it run once."""

from __future__ import annotations

import asyncio
import datetime as dt
import signal

import asyncpg

import cyclone
from cyclone.testing.plugin import CycloneEnv
from tests.conftest import python_module, queue_wakeups, reaped
from tests.e2e.sleep_app import sleepy
from tests.integration.test_sleep_nodes import asleep


async def start_worker(dsn: str) -> asyncio.subprocess.Process:
    return await python_module("tests.e2e.sleep_app", dsn)


async def test_a_sleeping_node_wakes_after_its_only_worker_was_killed(
    cyclone_env: CycloneEnv,
) -> None:
    client = cyclone_env.client
    await client.pool.execute("CREATE TABLE finished (n int NOT NULL)")
    ready: asyncio.Queue[str] = asyncio.Queue()
    listener = await asyncpg.connect(cyclone_env.dsn)
    try:
        await listener.add_listener("e2e_ready", lambda *a: ready.put_nowait(str(a[-1])))
        async with queue_wakeups(client) as seen:
            run = await sleepy.submit(client, 7)
            async with reaped(await start_worker(cyclone_env.dsn)) as doomed:
                await asyncio.wait_for(ready.get(), 60)
                await asleep(seen)  # the node went to sleep in that worker
                doomed.send_signal(signal.SIGKILL)
                assert await doomed.wait() == -signal.SIGKILL
        info = await run.info()
        nap = {n.name: n for n in info.nodes}["nap"]
        assert nap.state == "sleeping" and nap.wake_at is not None
        wake_at = nap.wake_at
        # No worker: the node is asleep in the database alone.
        async with reaped(await start_worker(cyclone_env.dsn)):
            assert await run.wait(timeout=120) is cyclone.RunState.COMPLETED
    finally:
        await listener.close()
    info = await run.info()
    assert info.finished_at is not None and info.finished_at >= wake_at
    nap = {n.name: n for n in info.nodes}["nap"]
    assert nap.state == "completed" and nap.attempts == 1
    output = (await run.payloads()).nodes["nap"].output
    assert dt.datetime.fromisoformat(output) == wake_at
    assert await client.pool.fetchval("SELECT count(*) FROM finished") == 1
