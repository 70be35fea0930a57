"""Shared helpers for Cyclone's own tests (fixtures come from the cyclone.testing plugin)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import sys
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg
import pytest
import pytest_asyncio

import cyclone
from cyclone._storage import queries as db
from cyclone._storage.loader import Queries
from cyclone.testing._citus import citus_cluster
from cyclone.testing.plugin import TEST_WORKER_OPTIONS, CycloneEnv, DatabaseFactory
from tests.citus.cluster import SESSIONS, CitusDatabases, require_citus

ROOT = Path(__file__).resolve().parents[1]
"""The repository's root."""


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--citus",
        action="store_true",
        help="run the tests on a Citus cluster started for the session (a coordinator and "
        "two worker nodes): each test's database is made on every node, Cyclone's tables "
        "on the coordinator",
    )


@pytest.fixture(scope="session")
def citus_databases() -> Iterator[CitusDatabases]:
    """Databases on a Citus cluster started for the session (skipped without Citus)."""
    require_citus()
    with citus_cluster(settings=SESSIONS) as cluster:
        factory = CitusDatabases(cluster)
        asyncio.run(factory.create_template())
        yield factory


@pytest.fixture(scope="session")
def cyclone_databases(request: pytest.FixtureRequest) -> Iterator[DatabaseFactory]:
    """The plugin's databases, or with ``--citus`` the Citus cluster's."""
    if request.config.getoption("--citus"):
        yield request.getfixturevalue("citus_databases")
        return
    factory = DatabaseFactory(request.getfixturevalue("cyclone_server"))
    asyncio.run(factory.create_template())
    yield factory
    asyncio.run(factory.drop_template())


PYTHON_BLOCK = re.compile(r"^```python\n(.*?)^```", re.MULTILINE | re.DOTALL)
"""A fenced Python code block of a Markdown page; group 1 is its code."""
DOC_PAGES = sorted([*ROOT.glob("docs/*.md"), ROOT / "README.md"])
"""The README and every page of the docs."""
RUN_PAGES = [p for p in DOC_PAGES if p.name not in {"performance.md", "reference.md"}]
"""The pages whose Python blocks tests/docs runs (the others are only parsed)."""
MARKER = re.compile(r"<!--\s*(not run|retry-safe|no retry claim)\s*(?::(.*?))?\s*-->")
"""A comment on the lines right before a block: ``<!-- not run: REASON -->``,
``<!-- retry-safe -->`` (the block is run twice), ``<!-- retry-safe: CALL -->`` (CALL is
awaited twice after the block) or ``<!-- no retry claim: REASON -->``."""


@dataclass(frozen=True)
class DocBlock:
    """A ```python block of a page, with the markers on the lines right before it."""

    line: int  # of the block's first line of code, in the page
    code: str
    markers: dict[str, str]  # marker name to its text after the colon ("" without one)


def doc_blocks(page: Path) -> list[DocBlock]:
    """The page's ```python blocks; a marker anywhere but right before a block fails."""
    text = page.read_text()
    found = []
    for match in PYTHON_BLOCK.finditer(text):
        markers = {}
        for before in reversed(text[: match.start()].rstrip().split("\n")):
            marker = MARKER.fullmatch(before.strip())
            if marker is None:
                break
            markers[marker[1]] = (marker[2] or "").strip()
        line = text.count("\n", 0, match.start(1)) + 1
        found.append(DocBlock(line=line, code=match[1], markers=markers))
    assert len(MARKER.findall(text)) == sum(len(b.markers) for b in found), (
        f"{page.name}: a <!-- marker --> must be on the lines right before a block"
    )
    return found


class Listener:
    """A real LISTEN connection on the client's channel that counts payloads."""

    def __init__(self, conn: asyncpg.Connection, channel: str) -> None:
        self.conn = conn
        self.channel = channel
        self.payloads: list[str] = []
        self.arrived = asyncio.Event()

    def _on(self, _conn: object, _pid: int, _channel: str, payload: object) -> None:
        self.payloads.append(str(payload))
        self.arrived.set()

    def counts(self) -> Counter[str]:
        return Counter(self.payloads)

    async def settle(self) -> None:
        """Make sure every NOTIFY sent before now has been delivered.

        A NOTIFY to ourselves from this connection is delivered after all earlier ones
        (PostgreSQL delivers notifications in commit order), so wait for it.
        """
        marker = f"marker:{len(self.payloads)}:{id(self)}"
        await self.conn.execute("SELECT pg_notify($1, $2)", self.channel, marker)
        async with asyncio.timeout(30):
            while marker not in self.payloads:
                self.arrived.clear()
                await self.arrived.wait()
        self.payloads.remove(marker)


class QueueWakeups:
    """The queue wakeups a client's own notifier dispatches, in order, once it listens."""

    def __init__(self) -> None:
        self.queues: list[str] = []
        self.grew = asyncio.Event()

    def record(self, queue: str) -> None:
        """A subscriber's callback."""
        if queue:  # "": the listener (re)connected, every queue polls
            self.queues.append(queue)
            self.grew.set()

    async def until(self, count: int) -> None:
        """Wait until ``count`` wakeups have been dispatched."""
        async with asyncio.timeout(30):
            while len(self.queues) < count:
                self.grew.clear()
                await self.grew.wait()


@contextlib.asynccontextmanager
async def queue_wakeups(client: cyclone.Client) -> AsyncIterator[QueueWakeups]:
    """The client's notifier listening, and what it dispatches to the queues' subscribers."""
    notifier = client.services.notifier
    assert notifier is not None
    seen = QueueWakeups()
    unsubscribe = notifier.subscribe_queues(seen.record)
    notifier.acquire()
    try:
        await asyncio.wait_for(notifier.connected.wait(), 30)
        yield seen
    finally:
        unsubscribe()
        await notifier.release()


class Records(logging.Handler):
    """Keeps the ``cyclone`` logger's records and lets a test await one."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []
        self.arrived = asyncio.Event()

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)
        self.arrived.set()

    def messages(self, containing: str) -> list[str]:
        """The messages so far that contain ``containing``."""
        return [r.getMessage() for r in self.records if containing in r.getMessage()]

    async def wait_for(self, containing: str) -> None:
        """Until a message contains ``containing``."""
        await self.first(f".*{re.escape(containing)}.*")

    async def first(self, pattern: str) -> logging.LogRecord:
        """The first record whose message matches ``pattern``, waiting for it if need be."""
        async with asyncio.timeout(60):
            while True:
                for record in self.records:
                    if re.fullmatch(pattern, record.getMessage(), re.DOTALL):
                        return record
                self.arrived.clear()
                await self.arrived.wait()


@pytest.fixture
def records() -> Iterator[Records]:
    """The ``cyclone`` logger's records from DEBUG up, for the test's duration."""
    handler = Records()
    logger = logging.getLogger("cyclone")
    old_level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old_level)


@contextlib.asynccontextmanager
async def listening(env: CycloneEnv) -> AsyncIterator[Listener]:
    """A :class:`Listener` on ``env``'s database, on its client's channel."""
    conn = await asyncpg.connect(env.dsn)
    lst = Listener(conn, env.client._channel)
    await conn.add_listener(lst.channel, lst._on)
    try:
        yield lst
    finally:
        await conn.close()


@pytest_asyncio.fixture
async def listener(cyclone_env: CycloneEnv) -> AsyncIterator[Listener]:
    async with listening(cyclone_env) as lst:
        yield lst


@contextlib.asynccontextmanager
async def recording_queries(conn: asyncpg.pool.PoolConnectionProxy) -> AsyncIterator[list[str]]:
    """The statements sent on ``conn`` inside the block that touch Cyclone's tables."""
    sent: list[str] = []

    def log(record: object) -> None:
        query = str(getattr(record, "query", ""))
        if "cyclone_" in query:
            sent.append(query)

    conn.add_query_logger(log)
    try:
        yield sent
    finally:
        conn.remove_query_logger(log)


async def count_rows(env: CycloneEnv, table: str, where: str = "true") -> int:
    """Rows in one of Cyclone's tables (``where``: a condition of the test's own)."""
    assert table in {"cyclone_runs", "cyclone_steps", "cyclone_edges", "cyclone_tasks"}
    return int(await env.pool.fetchval(f"SELECT count(*) FROM public.{table} WHERE {where}"))


async def dead_worker_running(
    env: CycloneEnv,
    run: cyclone.Run,
    worker: str,
    key: int,
    *,
    pid: int = 1,
    machine: str | None = None,
    grace: float | None = None,
) -> None:
    """As a killed worker leaves things: its live row names lock ``key``, which no session
    holds, and the task of ``run`` (a job's, or its only one) is running under it, leased
    for an hour. Without a ``grace`` the row is as a release before grace wrote it: lost as
    soon as its lock is free."""
    async with env.pool.acquire() as conn:
        q = env.client._queries
        task = await conn.fetchrow(
            "SELECT queue, kind FROM public.cyclone_tasks WHERE run_id = $1", run.id
        )
        await db.worker_present(
            conn, q, worker, "h", pid, [task["queue"]], [task["kind"]], [], 60, key,
            machine=machine, grace=grace,
        )  # fmt: skip
        await conn.execute(
            "UPDATE public.cyclone_tasks SET state = 'running', worker = $2, claims = 1,"
            " attempt = 1, lease_until = now() + interval '1 hour' WHERE run_id = $1",
            run.id,
            worker,
        )


async def released_by_a_peer(env: CycloneEnv, run: cyclone.Run) -> None:
    """Release the task of ``run`` as worker "peer-1"'s rescue releases a dead worker's,
    leaving the attempt's error with its evidence."""
    await dead_worker_running(env, run, "gone-1", 47)
    async with env.pool.acquire() as conn:
        assert await db.task_rescue(conn, env.client._queries, 100, by="peer-1")


async def one_migration_behind(env: CycloneEnv, schema: str) -> None:
    """Make ``schema`` as the previous release left it: every migration but the last."""
    await migrated_to(env, schema, Queries(schema).migrations[-2].version)


async def migrated_to(env: CycloneEnv, schema: str, version: int) -> None:
    """Make ``schema`` as migration ``version`` left it."""
    queries = Queries(schema)
    async with env.pool.acquire() as conn:
        await conn.execute(queries["schema_create"])
        await conn.execute(queries["migrations_table"])
        for m in [m for m in queries.migrations if m.version <= version]:
            await conn.execute(m.sql)
            sql, args = queries.bind("migrations_record", {"version": m.version, "name": m.name})
            await conn.execute(sql, *args)


async def waiting_on_a_lock(env: CycloneEnv, pid: int | None = None) -> None:
    """Until backend ``pid`` (or any session of this database) waits on a lock (observed, not
    slept on)."""
    async with asyncio.timeout(30):
        while not await env.pool.fetchval(  # noqa: ASYNC110 - another session's state
            "SELECT count(*) > 0 FROM pg_stat_activity"
            " WHERE datname = current_database() AND wait_event_type = 'Lock'"
            " AND ($1::int IS NULL OR pid = $1)",
            pid,
        ):
            await asyncio.sleep(0.01)


@contextlib.asynccontextmanager
async def reaped(
    proc: asyncio.subprocess.Process,
) -> AsyncIterator[asyncio.subprocess.Process]:
    """Use a child process; kill it on the way out if it is still running, and reap it."""
    try:
        yield proc
    finally:
        if proc.returncode is None:
            proc.kill()
        await proc.wait()


async def python_module(
    module: str, *args: object, env: dict[str, str] | None = None, **options: Any
) -> asyncio.subprocess.Process:
    """Start ``python -m MODULE ARGS`` from the repository's root, with the root on its path,
    ``env`` added to this process's environment, and ``options`` (``stdout=`` and so on) for
    :func:`asyncio.create_subprocess_exec`."""
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        module,
        *map(str, args),
        cwd=ROOT,
        env={**os.environ, **(env or {}), "PYTHONPATH": str(ROOT)},
        **options,
    )


def fast_worker(client: cyclone.Client, **options: Any) -> cyclone.Worker:
    """A worker with the test kit's short intervals and no retry backoff (any option can
    still be overridden)."""
    settings = {**TEST_WORKER_OPTIONS, "backoff": lambda attempt: 0.0, **options}
    return cyclone.Worker(client, **settings)


class Probe:
    """What handlers report to the test: events to await and a log of calls.

    Handlers are module-level, so their probe is too; ``reset()`` at the start of each test
    gives fresh events bound to that test's event loop.
    """

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.started = asyncio.Event()
        self.stopped = asyncio.Event()
        self.calls: list[Any] = []
