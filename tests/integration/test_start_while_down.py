"""A worker started while PostgreSQL is down waits for it (logged once, with the address
where nothing answers), then starts.

Each test stops and starts a server of its own (tests/chaos/cluster.py), never the shared one.
"""

from __future__ import annotations

import asyncio
import logging
import re
import signal
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import asyncpg
import pytest

import cyclone
from cyclone._services.readiness import address
from cyclone.testing._postgres import PostgresServer, free_port
from tests.chaos.cluster import Cluster, cluster_from, require_server_binaries, template_data
from tests.cli.app import echo
from tests.cli.process import line_with, start
from tests.conftest import Records, fast_worker, reaped

require_server_binaries()

pytestmark = pytest.mark.plain_only(
    "stops and starts a server of its own (or none at all): the session's cluster is not used"
)

# In both warnings for a database that cannot be reached: nothing answers at its address,
# or the server answers but takes no connection now.
WAITING = "waiting for it, trying again with a growing delay (at most 5 s)"
# The CLI's log format names the logger once; the messages do not name it again.
CLI_FORMAT = logging.Formatter("%(levelname)s %(name)s: %(message)s")


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
    assert waiting.startswith(
        f"nothing has answered at 127.0.0.1:{stopped.port} since the worker started "
        "(ConnectionRefusedError: "
    )
    assert "if the database is not on its way, check the DSN's host and port" in waiting
    [answered] = records.messages("the database answers")
    assert answered.startswith("the database answers and schema 'public' is migrated")


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
    assert stopped_waiting.startswith("stopped waiting for the database after ")
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
        line = await line_with(proc, WAITING)
        assert f"WARNING cyclone: nothing has answered at 127.0.0.1:{stopped.port} " in line
        assert "cyclone: cyclone:" not in line
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
        await line_with(proc, WAITING)
        proc.send_signal(signal.SIGTERM)
        assert "stopped waiting for the database" in await line_with(proc, "stopped waiting")
        assert await asyncio.wait_for(proc.wait(), 60) == 0


@pytest.mark.parametrize(
    ("host", "error"),
    [("127.0.0.1", "ConnectionRefusedError"), ("no-such-host.invalid", "gaierror")],
)
async def test_a_worker_says_nothing_answers_at_its_address(
    records: Records, host: str, error: str
) -> None:
    """A wrong host or port: the warning names the address to check, and the worker keeps
    waiting (a database may be starting there)."""
    where = f"{host}:{free_port()}"
    pool = await asyncpg.create_pool(f"postgresql://postgres@{where}/postgres", min_size=0)
    worker = fast_worker(cyclone.Client(pool, notify=False), steps=[echo])
    try:
        starting = asyncio.create_task(worker.start())
        record = await records.first(f".*{re.escape(WAITING)}.*")
        assert not starting.done()  # still waiting
        starting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await starting
    finally:
        await pool.close()
    message = record.getMessage()
    assert message.startswith(
        f"nothing has answered at {where} since the worker started ({error}: "
    )
    assert message.endswith(
        "): if the database is not on its way, check the DSN's host and port; waiting for it, "
        "trying again with a growing delay (at most 5 s)"
    )
    assert record.levelno == logging.WARNING
    assert CLI_FORMAT.format(record).startswith("WARNING cyclone: nothing has answered at ")
    assert len(records.messages(WAITING)) == 1


async def test_the_cli_worker_says_nothing_answers_at_a_wrong_port() -> None:
    port = free_port()
    dsn = f"postgresql://postgres@127.0.0.1:{port}/postgres"
    async with reaped(await start("worker", "tests.cli.app:WORK", dsn=dsn)) as proc:
        line = await line_with(proc, WAITING)
        assert f"WARNING cyclone: nothing has answered at 127.0.0.1:{port} since the worker" in line
        assert "check the DSN's host and port" in line and "cyclone: cyclone:" not in line
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), 60) == 0


@pytest.mark.parametrize(
    ("dsn", "where"),
    [
        ("postgresql://u:secret@db.example:6543/app", "db.example:6543"),
        ("postgresql://u@db.example/app", "db.example:5432"),
        ("postgresql:///app?host=/run/postgresql&port=5433", "/run/postgresql/.s.PGSQL.5433"),
        ("postgresql://u@h1:5432,h2:5433/app", "h1:5432,h2:5433"),
    ],
)
async def test_the_address_is_read_from_the_dsn(
    dsn: str, where: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("PGHOST", "PGPORT"):
        monkeypatch.delenv(name, raising=False)
    pool = asyncpg.create_pool(dsn, min_size=0)  # not started: it connects to nothing
    assert address(pool) == where
    assert "secret" not in address(pool)


async def test_the_address_falls_back_to_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PGHOST", "from-env")
    monkeypatch.setenv("PGPORT", "6000")
    assert address(asyncpg.create_pool("postgresql:///app", min_size=0)) == "from-env:6000"
