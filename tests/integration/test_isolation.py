"""Isolation levels: a caller's transaction may run at any level (Cyclone only inserts in
it), and Cyclone's own transactions run at READ COMMITTED whatever the session's default."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import asyncpg
import psycopg
import pytest
import pytest_asyncio

import cyclone
from cyclone._services.sync import pinned
from cyclone._storage import queries as db
from cyclone._worker.completer import Completer
from cyclone._worker.outcomes import Claimed, Completed
from cyclone.testing.plugin import CycloneEnv
from tests.conftest import fast_worker, waiting_on_a_lock

seen: list[str] = []  # the isolation of each completion transaction a handler wrote in


@cyclone.step("iso.double")
async def double(ctx: cyclone.Context, n: int) -> int:
    conn = await ctx.completion_tx()
    seen.append(await conn.fetchval("SHOW transaction_isolation"))
    return n * 2


@cyclone.step("iso.add")
async def add(ctx: cyclone.Context, n: int) -> int:
    return n + 1


chain = cyclone.define_result("iso.chain", int, int)
c_first = chain.node(double, name="first")
c_gate = chain.wait("gate", after=[c_first])
c_last = chain.node(add, name="last", after=[c_gate], input=lambda i, o: o["gate"])
chain.set_result(c_last)


@pytest.fixture(autouse=True)
def _reset() -> None:
    seen.clear()


@pytest.mark.parametrize("isolation", ["repeatable_read", "serializable"])
async def test_enqueue_and_submit_in_a_callers_stricter_transaction(
    cyclone_env: CycloneEnv, isolation: str
) -> None:
    client = cyclone_env.client
    async with cyclone_env.pool.acquire() as conn:
        tracked, wakeups = cyclone.track_wakeups(conn)
        async with tracked.transaction(isolation=isolation):
            level = await tracked.fetchval("SHOW transaction_isolation")
            job = await double.enqueue_tx(client, tracked, 5)
            jobs = await double.enqueue_many_tx(client, tracked, [1, 2])
            run = await chain.submit_tx(client, tracked, 1)
            once, created = await chain.submit_once_tx(client, tracked, f"k-{isolation}", 2)
            again, created_again = await chain.submit_once_tx(client, tracked, f"k-{isolation}", 2)
        assert level == isolation.replace("_", " ")
        assert (created, created_again, again.id) == (True, False, once.id)
        assert sorted(wakeups) == ["default"]  # published after the commit, as at any level
        await client.publish_wakeups(wakeups)
    async with fast_worker(client, steps=[double], workflows=[chain]):
        assert [await r.result(timeout=30) for r in (job, *jobs)] == [10, 2, 4]
        for r in (run, once):
            await client.signal(r.id, "gate", 100)  # kept until the gate is reached
            assert await r.result(timeout=30) == 100 + 1


@pytest_asyncio.fixture
async def serializable_pool(cyclone_env: CycloneEnv) -> AsyncIterator[asyncpg.Pool]:
    pool = await asyncpg.create_pool(
        cyclone_env.dsn,
        min_size=1,
        max_size=10,
        server_settings={"default_transaction_isolation": "serializable"},
    )
    try:
        yield pool
    finally:
        await pool.close()


async def test_cyclones_own_transactions_are_read_committed_on_a_serializable_pool(
    serializable_pool: asyncpg.Pool,
) -> None:
    async with cyclone.Client(serializable_pool) as client:
        assert await serializable_pool.fetchval("SHOW transaction_isolation") == "serializable"
        jobs = await double.enqueue_many(client, list(range(20)))
        run = await chain.submit(client, 3)
        cancelled = await chain.submit(client, 4)
        async with fast_worker(client, steps=[double], workflows=[chain]):
            assert [await j.result(timeout=30) for j in jobs] == [n * 2 for n in range(20)]
            await client.signal(run.id, "gate", 10)  # Cyclone's own transaction
            assert await run.result(timeout=30) == 10 + 1
            assert await cancelled.cancel() is True
            assert await cancelled.wait(timeout=30) == cyclone.RunState.CANCELLED
    assert seen and set(seen) == {"read committed"}  # every completion transaction


async def test_an_outcome_that_meets_a_serialization_failure_is_written_again(
    cyclone_env: CycloneEnv, serializable_pool: asyncpg.Pool
) -> None:
    # A job's completion is one statement, so it runs at the session's default. At
    # SERIALIZABLE, a task row updated by a transaction that commits after the statement's
    # snapshot fails it with 40001; nothing was written, so the completer sends it again.
    async with cyclone.Client(serializable_pool) as client:
        run = await double.enqueue(client, 4)
        async with serializable_pool.acquire() as conn:
            [row] = await db.task_claim(
                conn, client._queries, db.ClaimRequest("default", [double.name], 1, 30.0, "w", [])
            )
        claimed = Claimed.from_row(row, queue="default", worker="w")
        completer = Completer(client.services.database, client.services.publisher, bound=10)
        completer.start()
        try:
            async with cyclone_env.pool.acquire() as blocker, blocker.transaction():
                await blocker.execute(
                    "UPDATE cyclone_tasks SET lease_until = lease_until + interval '1 minute'"
                )
                written = asyncio.ensure_future(completer.submit(Completed(claimed, "8")))
                await waiting_on_a_lock(cyclone_env)
            assert await asyncio.wait_for(written, 30) is True
        finally:
            await completer.stop()
        assert await run.result(timeout=30) == 8


@pytest.mark.parametrize("autocommit", [True, False])
def test_the_sync_clients_own_transactions_are_read_committed(
    cyclone_env: CycloneEnv, autocommit: bool
) -> None:
    options = "-c default_transaction_isolation=serializable"
    with psycopg.connect(cyclone_env.dsn, autocommit=autocommit, options=options) as raw:
        with pinned(raw):
            assert raw.execute("SHOW transaction_isolation").fetchone() == ("read committed",)
        assert raw.isolation_level is None  # the connection's own setting, put back
        raw.execute("SELECT 1")
        raw.commit()
        with raw.transaction():  # a transaction of the caller's keeps the session default
            assert raw.execute("SHOW transaction_isolation").fetchone() == ("serializable",)
