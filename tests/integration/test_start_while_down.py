"""A worker started while PostgreSQL is down waits for it (logged once), then starts.

Each test stops and starts a server of its own (tests/chaos/cluster.py), never the shared one.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import asyncpg
import pytest

import cyclone
from cyclone.testing._postgres import PostgresServer
from tests.chaos.cluster import Cluster, cluster_from, require_server_binaries, template_data
from tests.cli.app import echo
from tests.cli.process import line_with, start
from tests.conftest import Records, fast_worker, reaped

require_server_binaries()

WAITING = "cyclone: cannot reach the database"


@pytest.fixture(scope="module")
def template() -> Iterator[Path]:
    with template_data() as data:
        yield data


@pytest.fixture
async def stopped(template: Path) -> AsyncIterator[Cluster]:
    """A server of the test's own with a migrated ``public`` schema, stopped."""
    with cluster_from(template) as cluster:
        pool = await asyncpg.create_pool(cluster.dsn, min_size=0, max_size=2)
        try:
            await cyclone.Client(pool).migrate()
        finally:
            await pool.close()
        await asyncio.to_thread(cluster.stop)
        yield cluster


@pytest.fixture
def records() -> Iterator[Records]:
    handler = Records()
    logger = logging.getLogger("cyclone")
    logger.addHandler(handler)
    level = logger.level
    logger.setLevel(logging.INFO)
    try:
        yield handler
    finally:
        logger.setLevel(level)
        logger.removeHandler(handler)


async def test_a_worker_waits_for_the_database_then_starts(
    stopped: Cluster, records: Records
) -> None:
    # min_size=0: asyncpg.create_pool itself would fail at once while the server is down.
    pool = await asyncpg.create_pool(stopped.dsn, min_size=0, max_size=4)
    client = cyclone.Client(pool)
    worker = fast_worker(client, steps=[echo])
    try:
        starting = asyncio.create_task(worker.start())
        await records.wait_for(WAITING)
        assert not starting.done()
        await asyncio.to_thread(stopped.start)
        await asyncio.wait_for(starting, 120)
        run = await echo.enqueue(client, 7)
        assert await run.result(timeout=60) == 7
    finally:
        await worker.stop()
        await pool.close()
    # One warning for the whole wait (it tried several times: pg_ctl start takes longer than
    # the first delays), then one line when it goes on.
    [waiting] = records.messages(WAITING)
    assert "ConnectionRefusedError" in waiting and "growing delay (at most 5 s)" in waiting
    [answered] = records.messages("the database answers")
    assert answered.startswith("cyclone: the database answers and schema 'public' is migrated")


async def test_a_pool_made_while_the_database_was_up_waits_too(
    stopped: Cluster, records: Records
) -> None:
    await asyncio.to_thread(stopped.start)
    pool = await asyncpg.create_pool(stopped.dsn, min_size=2, max_size=4)
    client = cyclone.Client(pool, notify=False)
    worker = fast_worker(client, steps=[echo])
    try:
        await asyncio.to_thread(stopped.stop, "immediate")  # the pool's connections are dead
        starting = asyncio.create_task(worker.start())
        await records.wait_for(WAITING)
        await asyncio.to_thread(stopped.start)
        await asyncio.wait_for(starting, 120)
    finally:
        await worker.stop()
        await pool.close()
    assert len(records.messages(WAITING)) == 1


async def test_cancelling_the_wait_says_what_it_waited_for(
    stopped: Cluster, records: Records
) -> None:
    pool = await asyncpg.create_pool(stopped.dsn, min_size=0, max_size=2)
    worker = fast_worker(cyclone.Client(pool), steps=[echo])
    try:
        starting = asyncio.create_task(worker.start())
        await records.wait_for(WAITING)
        starting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await starting
    finally:
        await pool.close()
    [stopped_waiting] = records.messages("stopped waiting")
    assert stopped_waiting.startswith("cyclone: stopped waiting for the database after ")
    assert "(cancelled); the last check failed with ConnectionRefusedError" in stopped_waiting


async def test_what_waiting_cannot_mend_is_raised_at_once(
    cyclone_server: PostgresServer,
) -> None:
    dsn = cyclone_server.dsn.rsplit("/", 1)[0] + "/no_such_database"
    pool = await asyncpg.create_pool(dsn, min_size=0, max_size=2)
    try:
        with pytest.raises(asyncpg.InvalidCatalogNameError):
            await fast_worker(cyclone.Client(pool), steps=[echo]).start()
    finally:
        await pool.close()


async def test_the_cli_worker_waits_for_the_database(stopped: Cluster) -> None:
    args = ("worker", "tests.cli.app:WORK", "--poll-interval", "0.1")
    async with reaped(await start(*args, dsn=stopped.dsn)) as proc:
        assert WAITING in await line_with(proc, "cannot reach")
        await asyncio.to_thread(stopped.start)
        await line_with(proc, "running; Ctrl-C stops it", timeout=120)
        pool = await asyncpg.create_pool(stopped.dsn, min_size=0, max_size=2)
        try:
            run = await echo.enqueue(cyclone.Client(pool, notify=False), 3)
            assert await run.result(timeout=60) == 3
        finally:
            await pool.close()
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), 60) == 0


async def test_a_signal_ends_the_cli_workers_wait(stopped: Cluster) -> None:
    async with reaped(await start("worker", "tests.cli.app:WORK", dsn=stopped.dsn)) as proc:
        await line_with(proc, "cannot reach")
        proc.send_signal(signal.SIGTERM)
        assert "stopped waiting for the database" in await line_with(proc, "stopped waiting")
        assert await asyncio.wait_for(proc.wait(), 60) == 0
