"""A worker killed with SIGKILL mid-step loses no work and duplicates no effect."""

from __future__ import annotations

import asyncio
import signal

import asyncpg

import cyclone
from cyclone.testing.plugin import CycloneEnv
from tests.conftest import python_module, reaped
from tests.e2e.worker_app import charge, flow


async def start_worker(dsn: str, lease: float) -> asyncio.subprocess.Process:
    return await python_module("tests.e2e.worker_app", dsn, lease)


async def kill_mid_step_then_rescue(env: CycloneEnv, run: cyclone.Run) -> None:
    """Start a worker process, SIGKILL it inside the charge step, start another to rescue."""
    started: asyncio.Queue[str] = asyncio.Queue()
    listener = await asyncpg.connect(env.dsn)
    try:
        await listener.add_listener("e2e_started", lambda *args: started.put_nowait(str(args[-1])))
        async with reaped(await start_worker(env.dsn, lease=1.0)) as doomed:
            assert await asyncio.wait_for(started.get(), 60) == "1"
            doomed.send_signal(signal.SIGKILL)
            assert await doomed.wait() == -signal.SIGKILL
        async with reaped(await start_worker(env.dsn, lease=30.0)):
            assert await run.wait(timeout=60) is cyclone.RunState.COMPLETED
    finally:
        await listener.close()


async def test_a_sigkilled_workers_task_is_claimed_again_at_once_at_the_default_lease(
    cyclone_env: CycloneEnv,
) -> None:
    """Two worker processes at the default 30 s lease; the one running attempt 1 is
    SIGKILLed, and its peer claims the task again within a few seconds: the server ends the
    dead process's session at once, and the peer's rescue probe sees its lock free."""
    await make_tables(cyclone_env)
    run = await charge.enqueue(cyclone_env.client, 9)
    started: asyncio.Queue[str] = asyncio.Queue()
    ready: asyncio.Queue[str] = asyncio.Queue()
    listener = await asyncpg.connect(cyclone_env.dsn)
    try:
        await listener.add_listener("e2e_started", lambda *a: started.put_nowait(str(a[-1])))
        await listener.add_listener("e2e_ready", lambda *a: ready.put_nowait(str(a[-1])))
        async with reaped(await start_worker(cyclone_env.dsn, lease=30.0)) as doomed:
            doomed_id = await asyncio.wait_for(ready.get(), 60)
            assert await asyncio.wait_for(started.get(), 60) == "1"
            async with reaped(await start_worker(cyclone_env.dsn, lease=30.0)):
                await asyncio.wait_for(ready.get(), 60)
                killed_at = asyncio.get_running_loop().time()
                doomed.send_signal(signal.SIGKILL)
                assert await doomed.wait() == -signal.SIGKILL
                # Well inside the 30 s lease: only the liveness rescue can do it.
                assert await asyncio.wait_for(started.get(), 15) == "2"
                rescued_in = asyncio.get_running_loop().time() - killed_at
                assert await run.wait(timeout=60) is cyclone.RunState.COMPLETED
    finally:
        await listener.close()
    print(f"claimed again {rescued_in:.2f} s after the SIGKILL")
    await assert_charged_once(cyclone_env, 9)
    [error] = (await run.info()).nodes[0].errors
    assert error["type"] == "WorkerLost" and doomed_id in error["message"]


async def make_tables(env: CycloneEnv) -> None:
    await env.pool.execute(
        "CREATE TABLE charges (order_id int, attempt int);"
        "CREATE TABLE started (order_id int, attempt int)"
    )


async def assert_charged_once(env: CycloneEnv, order_id: int) -> None:
    started = await env.pool.fetch("SELECT attempt FROM started ORDER BY attempt")
    assert [r["attempt"] for r in started] == [1, 2]
    charges = await env.pool.fetch("SELECT order_id, attempt FROM charges")
    assert [tuple(r) for r in charges] == [(order_id, 2)]  # attempt 1's write died with it


async def test_sigkill_mid_step_is_reclaimed_and_completes_once(cyclone_env: CycloneEnv) -> None:
    await make_tables(cyclone_env)
    run = await charge.enqueue(cyclone_env.client, 7)
    await kill_mid_step_then_rescue(cyclone_env, run)
    assert await run.result() == "charged 7"
    await assert_charged_once(cyclone_env, 7)
    errors = (await run.info()).nodes[0].errors
    # Its 1 s lease and its presence row (live for three 1/3 s heartbeats) run out together:
    # the rescuer finds it lost, or its lease expired, whichever it sees first.
    assert [e["type"] for e in errors] in (["LeaseExpired"], ["WorkerLost"])


async def test_sigkill_mid_workflow_completes_the_run_once(cyclone_env: CycloneEnv) -> None:
    await make_tables(cyclone_env)
    run = await flow.submit(cyclone_env.client, 8)
    await kill_mid_step_then_rescue(cyclone_env, run)
    assert await run.result() == "shipped after charged 8"
    await assert_charged_once(cyclone_env, 8)
    nodes = {n.name: (n.state, n.attempts) for n in (await run.info()).nodes}
    assert nodes == {
        "e2e.prepare": ("completed", 1),
        "charge": ("completed", 2),
        "e2e.ship": ("completed", 1),
    }
