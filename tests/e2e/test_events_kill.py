"""A wait node lives in the database: its worker's SIGKILL while it waits changes nothing."""

from __future__ import annotations

import asyncio
import signal

import asyncpg

from cyclone.testing.plugin import CycloneEnv
from tests.conftest import python_module, reaped
from tests.e2e.events_app import Approval, flow


async def start_worker(dsn: str) -> asyncio.subprocess.Process:
    return await python_module("tests.e2e.events_app", dsn)


async def test_a_waiting_any_of_node_survives_its_workers_sigkill(
    cyclone_env: CycloneEnv,
) -> None:
    client = cyclone_env.client
    waiting: asyncio.Queue[str] = asyncio.Queue()
    listener = await asyncpg.connect(cyclone_env.dsn)
    try:
        await listener.add_listener(
            "e2e_events_waiting", lambda *args: waiting.put_nowait(str(args[-1]))
        )
        run = await flow.submit(client, 7)
        async with reaped(await start_worker(cyclone_env.dsn)) as doomed:
            assert await asyncio.wait_for(waiting.get(), 60) == str(run.id)
            doomed.send_signal(signal.SIGKILL)
            assert await doomed.wait() == -signal.SIGKILL
        states = {n.name: n.state for n in (await run.info()).nodes}
        assert states["decision"] == "waiting"
        await client.signal(run.id, "decision", Approval("ops"), event="approved")
        async with reaped(await start_worker(cyclone_env.dsn)):
            assert await run.result(timeout=60) == "shipped 7, approved by ops"
    finally:
        await listener.close()
