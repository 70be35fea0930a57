"""Rescue by liveness: a worker's own session holds an advisory lock while it lives; when
that session ends, its peers release its tasks at once (WorkerLost), and the worker, if it
still lives, stops its handlers and claims nothing until it holds its lock again."""

from __future__ import annotations

import asyncio

import asyncpg
import pytest

import cyclone
from cyclone._storage import queries as db
from cyclone.testing.plugin import CycloneEnv
from tests.conftest import Probe, fast_worker

probe = Probe()
CANCELLED: list[int] = []  # attempts of live.hold that were cancelled


@pytest.fixture(autouse=True)
def _reset() -> None:
    probe.reset()
    CANCELLED.clear()


@cyclone.step("live.hold", queue="live")
async def hold(ctx: cyclone.Context, n: int) -> int:
    probe.calls.append(ctx.attempt)
    if ctx.attempt == 1:
        probe.started.set()
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            CANCELLED.append(ctx.attempt)
            raise
    return n


async def liveness_backend(env: CycloneEnv, worker: cyclone.Worker) -> int:
    """The pid of the session holding ``worker``'s liveness lock."""
    key = worker._presence.key
    assert key is not None
    pid: int = await env.pool.fetchval(
        "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND classid = 1668899693"
        " AND objid = $1::int::oid AND objsubid = 2 AND granted",
        key,
    )
    return pid


async def dead_worker_running(env: CycloneEnv, run: cyclone.Run, worker: str, key: int) -> None:
    """As a killed worker leaves things: its live row names lock ``key``, which no session
    holds, and the run's task is running under it, leased for an hour."""
    async with env.pool.acquire() as conn:
        q = env.client._queries
        await db.worker_present(conn, q, worker, "h", 1, ["live"], ["live.hold"], [], 60, key)
        await conn.execute(
            "UPDATE public.cyclone_tasks SET state = 'running', worker = $2, claims = 1,"
            " attempt = 1, lease_until = now() + interval '1 hour' WHERE run_id = $1",
            run.id,
            worker,
        )


async def test_a_worker_holds_its_liveness_lock_and_names_it(cyclone_env: CycloneEnv) -> None:
    async with fast_worker(cyclone_env.client, steps=[hold]) as worker:
        row = await cyclone_env.pool.fetchrow(
            "SELECT liveness FROM public.cyclone_workers WHERE id = $1", worker.id
        )
        assert row is not None and row["liveness"] == worker._presence.key
        assert await liveness_backend(cyclone_env, worker) > 0
        async with cyclone_env.pool.acquire() as conn:
            assert await db.workers_lost(conn, cyclone_env.client._queries) == []
    # Stopped: the session is closed and the row gone, so nobody takes it for lost.
    async with cyclone_env.pool.acquire() as conn:
        assert await db.workers_lost(conn, cyclone_env.client._queries) == []


async def test_a_lost_sessions_tasks_are_released_at_once_as_worker_lost(
    cyclone_env: CycloneEnv,
) -> None:
    """The session of the worker running attempt 1 is terminated (as when its process dies,
    seen from the server): the task runs again long before the 30 s lease, and the worker
    itself, still alive, stops its handler and writes nothing for it."""
    run = await hold.enqueue(cyclone_env.client, 5)
    async with fast_worker(cyclone_env.client, steps=[hold], lease=30.0) as doomed:
        await asyncio.wait_for(probe.started.wait(), 30)
        async with fast_worker(cyclone_env.client, steps=[hold], lease=30.0):
            pid = await liveness_backend(cyclone_env, doomed)
            assert await cyclone_env.pool.fetchval("SELECT pg_terminate_backend($1)", pid)
            # Released by the peer's probe, not the lease (30 s).
            assert await run.result(timeout=20) == 5
        assert CANCELLED == [1]
    [error] = (await run.info()).nodes[0].errors
    assert error["type"] == "WorkerLost" and doomed.id in error["message"]
    assert probe.calls == [1, 2]


async def test_a_worker_takes_its_lock_again_and_claims_again(cyclone_env: CycloneEnv) -> None:
    """Alone, a worker whose session ended releases its own tasks with its probe, takes its
    lock again on a new session, and runs the task's next attempt."""
    run = await hold.enqueue(cyclone_env.client, 6)
    async with fast_worker(cyclone_env.client, steps=[hold], lease=30.0) as worker:
        await asyncio.wait_for(probe.started.wait(), 30)
        first = await liveness_backend(cyclone_env, worker)
        assert await cyclone_env.pool.fetchval("SELECT pg_terminate_backend($1)", first)
        assert await run.result(timeout=20) == 6
        assert worker._presence.live.is_set()
        assert await liveness_backend(cyclone_env, worker) != first
    assert [e["type"] for e in (await run.info()).nodes[0].errors] == ["WorkerLost"]


async def test_without_a_listener_a_worker_holds_no_lock(cyclone_env: CycloneEnv) -> None:
    """notify=False (a pooler in transaction mode, no listen_dsn): no session of its own, so
    its row names no lock and its tasks wait for their leases."""
    client = cyclone.Client(cyclone_env.pool, notify=False)
    async with fast_worker(client, steps=[hold]) as worker:
        liveness = await cyclone_env.pool.fetchval(
            "SELECT liveness FROM public.cyclone_workers WHERE id = $1", worker.id
        )
        assert liveness is None and worker._presence.key is None
        held = await cyclone_env.pool.fetchval(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND classid = 1668899693"
        )
        assert held == 0


async def test_a_row_naming_a_lock_nobody_holds_is_lost(cyclone_env: CycloneEnv) -> None:
    """As a killed worker's row looks until it expires: found lost, and its running task
    released with WorkerLost by any worker's maintenance."""
    run = await hold.enqueue(cyclone_env.client, 7)
    q = cyclone_env.client._queries
    await dead_worker_running(cyclone_env, run, "ghost", 42)
    async with cyclone_env.pool.acquire() as conn:
        assert await db.workers_lost(conn, q) == ["ghost"]
        # A session that takes the lock makes it live again.
        other = await asyncpg.connect(cyclone_env.dsn)
        try:
            assert await db.worker_liveness_hold(other, q, 42)
            assert await db.workers_lost(conn, q) == []
        finally:
            await other.close()
        assert await db.workers_lost(conn, q) == ["ghost"]
    async with fast_worker(cyclone_env.client, steps=[hold]) as worker:
        await worker.maintain_once()
        assert await run.result(timeout=20) == 7
    [error] = (await run.info()).nodes[0].errors
    assert error["type"] == "WorkerLost" and "ghost" in error["message"]


async def test_a_second_live_worker_under_one_id_is_refused(cyclone_env: CycloneEnv) -> None:
    """Two live workers under one id would share a row, and one's death would release the
    other's tasks: the second is refused at start. Once the first stops, the id is free."""
    async with fast_worker(cyclone_env.client, steps=[hold], worker_id="twin"):
        second = fast_worker(cyclone_env.client, steps=[hold], worker_id="twin")
        with pytest.raises(cyclone.InvalidStateError, match="another live worker runs as 'twin'"):
            await second.start()
        row = await cyclone_env.pool.fetchval(
            "SELECT count(*) FROM public.cyclone_workers WHERE id = 'twin'"
        )
        assert row == 1  # the first one's row is left alone
        locks = await cyclone_env.pool.fetchval(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND classid = 1668899693"
        )
        assert locks == 1  # the refused one kept no session
    async with fast_worker(cyclone_env.client, steps=[hold], worker_id="twin") as again:
        assert again._presence.live.is_set()


async def test_a_worker_started_again_under_its_id_releases_its_old_tasks(
    cyclone_env: CycloneEnv,
) -> None:
    """A fixed worker_id (a pod's name) started again after its process died: the row still
    names the old, free lock, so the new process releases the old one's tasks at start."""
    run = await hold.enqueue(cyclone_env.client, 8)
    await dead_worker_running(cyclone_env, run, "pod-1", 43)
    async with fast_worker(cyclone_env.client, steps=[hold], worker_id="pod-1"):
        assert await run.result(timeout=20) == 8
    [error] = (await run.info()).nodes[0].errors
    assert error["type"] == "WorkerLost"
