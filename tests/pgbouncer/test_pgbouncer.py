"""Cyclone through PgBouncer in transaction pooling mode (Debian's pgbouncer, started here).

Supported: an asyncpg pool on PgBouncer with ``statement_cache_size=0`` for enqueue, submit,
the ``*_tx`` variants and ``submit_once`` (its two-transaction rule included), and a worker with
``notify=False`` that finds work by polling. Not supported, and pinned here so a change shows:
asyncpg's statement cache (named prepared statements) through PgBouncer older than 1.21.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import asyncpg
import pytest

import cyclone
from cyclone.testing.plugin import CycloneEnv
from tests.conftest import fast_worker, waiting_on_a_lock
from tests.pgbouncer.conftest import Bouncer


@cyclone.step("bouncer.double", queue="bouncer")
async def double(ctx: cyclone.Context, n: int) -> int:
    return 2 * n


flow = cyclone.define_result("bouncer.flow", int, int)
flow.set_result(flow.node(double))


@pytest.fixture
async def bounced(pgbouncer: Bouncer, cyclone_env: CycloneEnv) -> AsyncIterator[cyclone.Client]:
    """A client whose pool goes through PgBouncer, without asyncpg's statement cache."""
    pool = await asyncpg.create_pool(
        pgbouncer.dsn_for(cyclone_env.dsn), min_size=1, max_size=8, statement_cache_size=0
    )
    client = cyclone.Client(pool, notify=False)
    try:
        yield client
    finally:
        await client.aclose()
        await pool.close()


async def test_enqueue_submit_and_tx_variants_then_a_polling_worker_runs_them(
    bounced: cyclone.Client,
) -> None:
    runs: list[cyclone.Run] = [await double.enqueue(bounced, 1), await flow.submit(bounced, 2)]
    async with bounced.pool.acquire() as conn, conn.transaction():
        runs.append(await double.enqueue_tx(bounced, conn, 3))
        runs.append(await flow.submit_tx(bounced, conn, 4))
        runs += await double.enqueue_many_tx(bounced, conn, [5, 6])
    # Many at once: each statement must hold whatever server connection PgBouncer gives it.
    runs += await asyncio.gather(*(double.enqueue(bounced, n) for n in range(7, 47)))
    async with fast_worker(bounced, steps=[double], workflows=[flow], poll_interval=0.2):
        outputs = [await r.result(timeout=60) for r in runs]  # type: ignore[attr-defined]
    assert outputs == [2 * n for n in range(1, 47)]


async def test_submit_once_through_pgbouncer(
    bounced: cyclone.Client, cyclone_env: CycloneEnv
) -> None:
    run, created = await flow.submit_once(bounced, "k1", 5)
    again, created_again = await flow.submit_once(bounced, "k1", 5)
    assert (created, created_again, again.id) == (True, False, run.id)
    with pytest.raises(cyclone.SubmitConflictError):
        await flow.submit_once(bounced, "k1", 6)


async def test_submit_once_second_transaction_waits_for_the_first(
    bounced: cyclone.Client, cyclone_env: CycloneEnv
) -> None:
    async with bounced.pool.acquire() as first:
        tx = first.transaction()
        await tx.start()
        run, created = await flow.submit_once_tx(bounced, first, "shared", 1)
        first_pid = await first.fetchval("SELECT pg_backend_pid()")

        async def second() -> tuple[cyclone.Run, bool]:
            async with bounced.pool.acquire() as conn, conn.transaction():
                return await flow.submit_once_tx(bounced, conn, "shared", 1)

        waiter = asyncio.create_task(second())
        await waiting_on_a_lock(cyclone_env)  # the second server connection waits on the key
        assert not waiter.done()
        assert await first.fetchval("SELECT pg_backend_pid()") == first_pid  # still pinned
        await tx.commit()
    other, other_created = await asyncio.wait_for(waiter, 30)
    assert (created, other_created, other.id) == (True, False, run.id)


async def test_the_statement_cache_through_pgbouncer_fails_with_asyncpgs_hint(
    pgbouncer: Bouncer, cyclone_env: CycloneEnv
) -> None:
    pool = await asyncpg.create_pool(pgbouncer.dsn_for(cyclone_env.dsn), min_size=4, max_size=4)
    client = cyclone.Client(pool, notify=False)
    try:
        with pytest.raises(
            (asyncpg.DuplicatePreparedStatementError, asyncpg.InvalidSQLStatementNameError)
        ) as caught:
            for _ in range(20):
                await asyncio.gather(*(double.enqueue(client, n) for n in range(8)))
    finally:
        await client.aclose()
        await pool.close()
    print(f"{pgbouncer.version}: {type(caught.value).__name__}: {caught.value}")
    assert "pgbouncer" in str(caught.value).lower() or "statement_cache_size" in str(
        getattr(caught.value, "hint", "")
    )


async def test_liveness_behind_pgbouncer_is_a_session_straight_to_postgresql(
    pgbouncer: Bouncer, cyclone_env: CycloneEnv
) -> None:
    """With listen_dsn a worker's liveness lock is held on a session of its own straight to
    PostgreSQL (its pid is the backend's: no pooler between); with notify=False it holds
    none, and its row names none, so its tasks wait for their leases."""
    pool = await asyncpg.create_pool(
        pgbouncer.dsn_for(cyclone_env.dsn), min_size=1, max_size=8, statement_cache_size=0
    )
    direct = cyclone.Client(pool, listen_dsn=cyclone_env.dsn)
    polling = cyclone.Client(pool, notify=False)
    try:
        async with fast_worker(direct, steps=[double], poll_interval=0.2) as worker:
            session = worker._presence._session
            assert session is not None and worker._presence.key is not None
            holder = await cyclone_env.pool.fetchval(
                "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND classid = 1668899693"
                " AND objid = $1::int::oid AND granted",
                worker._presence.key,
            )
            assert holder == session.get_server_pid()
        async with fast_worker(polling, steps=[double], poll_interval=0.2) as worker:
            liveness = await cyclone_env.pool.fetchval(
                "SELECT liveness FROM public.cyclone_workers WHERE id = $1", worker.id
            )
            assert liveness is None
    finally:
        await direct.aclose()
        await polling.aclose()
        await pool.close()
