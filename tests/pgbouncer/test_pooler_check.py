"""What cannot work through PgBouncer in transaction mode is refused at start, naming the fix;
a worker's LISTEN connection can go straight to PostgreSQL (``listen_dsn=``, ``--listen-dsn``).
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import AsyncIterator, Awaitable, Callable

import asyncpg
import pytest

import cyclone
from cyclone._services.pooler import LISTEN, STATEMENT_CACHE
from cyclone.testing.plugin import CycloneEnv
from tests.cli.app import echo
from tests.cli.process import cli, line_with, one_line_error, start
from tests.conftest import fast_worker, reaped
from tests.pgbouncer.conftest import Bouncer
from tests.pgbouncer.test_pgbouncer import double

PoolMaker = Callable[..., Awaitable[asyncpg.Pool]]


@pytest.fixture
async def bounced_pool(pgbouncer: Bouncer, cyclone_env: CycloneEnv) -> AsyncIterator[PoolMaker]:
    """Make pools through PgBouncer (closed afterwards)."""
    pools: list[asyncpg.Pool] = []

    async def make(*, statement_cache_size: int = 100) -> asyncpg.Pool:
        pool: asyncpg.Pool = await asyncpg.create_pool(
            pgbouncer.dsn_for(cyclone_env.dsn),
            min_size=1,
            max_size=4,
            statement_cache_size=statement_cache_size,
        )
        pools.append(pool)
        return pool

    try:
        yield make
    finally:
        for pool in pools:
            await pool.close()


async def test_the_statement_cache_is_refused_at_start(bounced_pool: PoolMaker) -> None:
    pool = await bounced_pool()
    client = cyclone.Client(pool, notify=False)
    worker = fast_worker(client, steps=[double])
    with pytest.raises(cyclone.UnsupportedPoolerError) as caught:
        await worker.start()
    assert str(caught.value) == STATEMENT_CACHE
    assert str(caught.value) == (
        "the pool goes through a connection pooler in transaction mode (PgBouncer?), and "
        "asyncpg's statement cache is on: its prepared statements would fail later with "
        "'prepared statement \"__asyncpg_stmt_N__\" does not exist'; create the pool with "
        "statement_cache_size=0 (CLI: --statement-cache-size 0)"
    )
    with pytest.raises(cyclone.UnsupportedPoolerError):
        await client.check_schema()


async def test_listen_through_pgbouncer_is_refused_at_start(
    bounced_pool: PoolMaker,
) -> None:
    pool = await bounced_pool(statement_cache_size=0)
    client = cyclone.Client(pool)  # notify=True, LISTEN through the pool's route
    await client.check_schema()  # a producer does not listen: nothing to refuse
    with pytest.raises(cyclone.UnsupportedPoolerError) as caught:
        await fast_worker(client, steps=[double]).start()
    assert str(caught.value) == LISTEN
    assert str(caught.value) == (
        "the pool goes through a connection pooler in transaction mode (PgBouncer?), where "
        "LISTEN receives nothing: pass notify=False to cyclone.Client to poll (CLI: "
        "--no-notify), or listen_dsn= a DSN straight to PostgreSQL (CLI: --listen-dsn)"
    )


async def test_straight_to_postgres_nothing_is_refused(cyclone_env: CycloneEnv) -> None:
    pool = await asyncpg.create_pool(cyclone_env.dsn, min_size=1, max_size=4)  # cache on
    try:
        async with fast_worker(cyclone.Client(pool), steps=[double]):
            pass
    finally:
        await pool.close()


async def test_a_worker_listens_straight_to_postgres(
    bounced_pool: PoolMaker, cyclone_env: CycloneEnv
) -> None:
    pool = await bounced_pool(statement_cache_size=0)
    client = cyclone.Client(pool, listen_dsn=cyclone_env.dsn)
    # A poll once a minute: only a notification can get the job done within the timeout.
    async with fast_worker(client, steps=[double], poll_interval=60.0):
        await asyncio.wait_for(client.services.notifier.connected.wait(), 60)
        run = await double.enqueue(client, 21)
        assert await run.result(timeout=30) == 42
    await client.aclose()


def test_listen_dsn_needs_notify(cyclone_env: CycloneEnv) -> None:
    with pytest.raises(cyclone.InvalidInputError, match="needs notify=True"):
        cyclone.Client(cyclone_env.pool, notify=False, listen_dsn=cyclone_env.dsn)


async def test_the_cli_names_the_fix(pgbouncer: Bouncer, cyclone_env: CycloneEnv) -> None:
    bounced = pgbouncer.dsn_for(cyclone_env.dsn)
    code, _, err = await cli("runs", "ls", dsn=bounced)
    assert one_line_error(code, err) == f"cyclone: {STATEMENT_CACHE}"
    code, _, err = await cli(
        "--statement-cache-size", "0", "worker", "tests.cli.app:WORK", dsn=bounced
    )
    assert one_line_error(code, err) == f"cyclone: {LISTEN}"


async def test_the_cli_worker_listens_straight_to_postgres(
    pgbouncer: Bouncer, cyclone_env: CycloneEnv
) -> None:
    args = (
        "--statement-cache-size", "0", "worker", "tests.cli.app:WORK",
        "--poll-interval", "60", "--listen-dsn", cyclone_env.dsn,
    )  # fmt: skip
    bounced = pgbouncer.dsn_for(cyclone_env.dsn)
    async with reaped(await start(*args, dsn=bounced)) as proc:
        await line_with(proc, "running; Ctrl-C stops it")
        # The worker's first claim ran before this enqueue; only a wakeup can claim it now.
        run = await echo.enqueue(cyclone_env.client, 5)
        assert await run.result(timeout=30) == 5
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), 60) == 0
