"""PgQueuer and Procrastinate through their public APIs, each in a database of its own on the
benchmark's server: the same no-op job, the same numbers of jobs and calls as Cyclone's side.

Settings are each library's documented defaults except the concurrency of 16:

- PgQueuer: ``Queries``/``QueueManager`` over one asyncpg connection (``AsyncpgDriver``), the
  entrypoint registered with ``concurrency_limit=16``, ``QueueManager.run(mode=drain)``
  (default ``batch_size=10``); single enqueue is ``Queries.enqueue(name, payload)``, a batch is
  ``Queries.enqueue([names], [payloads], [priorities])``.
- Procrastinate: ``App(connector=PsycopgConnector(conninfo=...))`` with its default pool,
  ``run_worker_async(concurrency=16, wait=False)`` (stops when the queue is empty); single
  enqueue is ``defer_async``, a batch is ``batch_defer_async``.

Both are installed by the ``bench`` extra (``pip install -e '.[bench]'``, or ``nox -s bench``).
"""

from __future__ import annotations

import asyncio
import importlib.util
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

import asyncpg

from benchmarks.floor import Figure

if TYPE_CHECKING:
    from procrastinate.types import JSONValue

CONCURRENCY = 16
BATCH = 1_000
WARMUP = 200
LIBRARIES = ("pgqueuer", "procrastinate")


def missing() -> list[str]:
    """The comparison libraries that are not installed."""
    return [name for name in LIBRARIES if importlib.util.find_spec(name) is None]


class Counter:
    """Handler calls, and an event once ``target`` is reached."""

    def __init__(self, target: int) -> None:
        self.count, self.target, self.done = 0, target, asyncio.Event()

    def hit(self) -> None:
        self.count += 1
        if self.count >= self.target:
            self.done.set()


class Library:
    """One library's three figures; subclasses give enqueue, enqueue_many and drain."""

    name = ""

    async def enqueue(self, i: int) -> None:
        raise NotImplementedError

    async def enqueue_many(self, items: list[int]) -> None:
        raise NotImplementedError

    async def drain(self, n: int) -> None:
        """Run a worker until n queued jobs are done."""
        raise NotImplementedError

    async def clear(self) -> None:
        raise NotImplementedError

    async def figures(self, n: int, calls: int) -> list[Figure]:
        """enqueue calls/s, enqueue_many jobs/s and drain jobs/s, after a warm-up."""
        out = []
        await self.clear()
        start = time.perf_counter()
        for i in range(calls):
            await self.enqueue(i)
        out.append(self._figure("enqueue", calls, start, "calls/s", f"n={calls}, sequential"))
        await self.clear()
        start = time.perf_counter()
        for lo in range(0, n, BATCH):
            await self.enqueue_many(list(range(lo, min(n, lo + BATCH))))
        out.append(self._figure("enqueue_many", n, start, "jobs/s", f"n={n} batch={BATCH}"))
        start = time.perf_counter()
        await self.drain(n)
        detail = f"n={n}, concurrency {CONCURRENCY}, worker in this process"
        out.append(self._figure("drain c16", n, start, "jobs/s", detail))
        await self.clear()
        return out

    async def warm_up(self) -> None:
        """Exercise every path once so that connections and statements are ready."""
        await self.clear()
        for i in range(WARMUP):
            await self.enqueue(i)
        await self.enqueue_many(list(range(WARMUP)))
        await self.drain(2 * WARMUP)
        await self.clear()

    def _figure(self, what: str, n: int, start: float, unit: str, detail: str) -> Figure:
        return Figure(f"{self.name} {what}", n / (time.perf_counter() - start), unit, detail)


class PgQueuer(Library):
    """PgQueuer over one asyncpg connection, as its documentation starts."""

    name = "pgqueuer"

    def __init__(self, conn: asyncpg.Connection) -> None:
        from pgqueuer import Queries

        self.conn = conn
        self.queries = Queries.from_asyncpg_connection(conn)

    async def install(self) -> None:
        if not await self.queries.schema_is_installed():
            await self.queries.install()

    async def enqueue(self, i: int) -> None:
        await self.queries.enqueue("noop", str(i).encode())

    async def enqueue_many(self, items: list[int]) -> None:
        k = len(items)
        await self.queries.enqueue(["noop"] * k, [str(i).encode() for i in items], [0] * k)

    async def drain(self, n: int) -> None:
        from pgqueuer import QueueManager
        from pgqueuer.types import QueueExecutionMode

        qm = QueueManager(self.queries)
        counter = Counter(n)

        @qm.entrypoint("noop", concurrency_limit=CONCURRENCY)
        async def noop(job: Any) -> None:
            counter.hit()

        await qm.run(mode=QueueExecutionMode.drain)
        if counter.count < n:
            raise RuntimeError(f"pgqueuer drained {counter.count} of {n} jobs")

    async def clear(self) -> None:
        await self.conn.execute("TRUNCATE pgqueuer, pgqueuer_log, pgqueuer_statistics")


class Procrastinate(Library):
    """Procrastinate with its psycopg connector and default pool."""

    name = "procrastinate"

    def __init__(self, dsn: str) -> None:
        import procrastinate

        self.app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=dsn))
        self.counter = Counter(0)
        counter = self

        @self.app.task(name="noop", queue="bench")
        async def noop(i: int) -> None:
            counter.counter.hit()

        self.task = noop

    async def install(self) -> None:
        connector = self.app.connector
        exists = await connector.execute_query_one_async(
            "SELECT to_regclass('procrastinate_jobs') IS NOT NULL AS e"
        )
        if not exists["e"]:
            await self.app.schema_manager.apply_schema_async()

    async def enqueue(self, i: int) -> None:
        await self.task.defer_async(i=i)

    async def enqueue_many(self, items: list[int]) -> None:
        batch: list[dict[str, JSONValue]] = [{"i": i} for i in items]
        await self.task.batch_defer_async(*batch)

    async def drain(self, n: int) -> None:
        self.counter = Counter(n)
        await self.app.run_worker_async(
            queues=["bench"], concurrency=CONCURRENCY, wait=False, install_signal_handlers=False
        )
        if self.counter.count < n:
            raise RuntimeError(f"procrastinate drained {self.counter.count} of {n} jobs")

    async def clear(self) -> None:
        await self.app.connector.execute_query_async(
            "TRUNCATE procrastinate_jobs, procrastinate_events RESTART IDENTITY CASCADE"
        )


async def _database(admin: asyncpg.Pool, name: str) -> None:
    if not await admin.fetchval("SELECT 1 FROM pg_database WHERE datname = $1", name):
        await admin.execute(f"CREATE DATABASE {name}")


@asynccontextmanager
async def libraries(
    admin: asyncpg.Pool, dsn_for: Callable[[str], str]
) -> AsyncIterator[dict[str, Library]]:
    """Each installed library, set up in its own database and warmed up."""
    found: dict[str, Library] = {}
    conn: asyncpg.Connection | None = None
    proc: Procrastinate | None = None
    try:
        if importlib.util.find_spec("pgqueuer"):
            await _database(admin, "bench_pgqueuer")
            conn = await asyncpg.connect(dsn_for("bench_pgqueuer"))
            pgq = PgQueuer(conn)
            await pgq.install()
            found[pgq.name] = pgq
        if importlib.util.find_spec("procrastinate"):
            await _database(admin, "bench_procrastinate")
            proc = Procrastinate(dsn_for("bench_procrastinate"))
            await proc.app.open_async()
            await proc.install()
            found[proc.name] = proc
        for lib in found.values():
            await lib.warm_up()
        yield found
    finally:
        if proc is not None:
            await proc.app.close_async()
        if conn is not None:
            await conn.close()
