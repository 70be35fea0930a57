"""Raw-SQL floor for the cyclone benchmarks.

Each function does, with plain asyncpg and no cyclone code, the database work one library
benchmark does, in the fastest reasonable plain-asyncpg way. Run against the same server in the
same run as the library benchmarks, these numbers are the baseline the library's figures are
printed as ratios to: what is left over is the library's own cost.

- ``insert_unnest``: batched ``INSERT ... SELECT * FROM unnest($1::text[], $2::jsonb[])``, one
  round trip and one commit per batch. The best set-based insert in ordinary SQL.
- ``insert_copy``: binary ``COPY`` via ``copy_records_to_table``, the fastest bulk load
  PostgreSQL offers; the ceiling for batch enqueue.
- ``insert_single``: one parameterised ``INSERT`` per call, each acquiring a pool connection and
  committing on its own, as an HTTP handler enqueuing one job would.
- ``insert_notify``: one ``INSERT`` and one ``pg_notify`` per transaction, sequential, on one
  connection held throughout: the floor for an enqueue that wakes a worker.
- ``insert_notify_consumed``: ``insert_notify`` while a ``LISTEN``ing connection in the same
  process deletes each job as it is notified: the floor for an enqueue beside an embedded
  worker, which has to pay for that worker's work on the same machine.
- ``drain_delete``: concurrent clients, each holding a connection, claim a batch with
  ``FOR UPDATE SKIP LOCKED`` and complete it by ``DELETE`` in one statement. The fastest raw
  queue: no leases, retries or history.
- ``drain_update``: the same, but completion flips ``state`` from 'available' to 'done' under a
  partial index and rows stay, showing what keeping finished jobs costs against deleting them.
- ``insert_runs_tasks`` and ``drain_runs_tasks``: ``insert_unnest`` and ``drain_delete`` on
  copies of Cyclone's own two tables (``LIKE ... INCLUDING ALL``: the same columns, indexes,
  constraints and storage parameters), doing the least that storage asks of a queue: a run
  row and a task row per job in one statement; a claim that marks tasks running under a
  lease (no WAL flush wait, as Cyclone's) and reads each one's run by key, then a durable
  completion that deletes the tasks it still owns and marks their runs completed. They need
  Cyclone's schema migrated in ``CYCLONE_SCHEMA``; beside the one-table floors, they show
  what the storage itself costs, and beside Cyclone, what is left for the library.
- ``wake_latency``: a producer inserts a row and ``pg_notify``s in one transaction; a listener
  connection claims the row as soon as the notification arrives. Latency runs from just before
  ``COMMIT`` to the claimed row being returned; p50 and p99 in milliseconds.

Timings cover only the measured work: table setup, prefill and payload encoding (payloads are
pre-encoded JSON text) are excluded. Each function (re)creates its tables in schema ``floor``
and drops them at the end. The pool must use asyncpg's default jsonb codec (JSON text in and
out) and should allow at least ``clients`` connections, or the drains run less concurrently.

Try it alone: ``python benchmarks/floor.py --dsn postgresql://...``
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

import asyncpg

QUEUE = "q"
CHANNEL = "floor_wake"
CYCLONE_SCHEMA = "public"  # where the two-table floors copy Cyclone's tables from
CLIENTS = 16
PREFILL_BATCH = 1_000

Connect = Callable[[], Awaitable[asyncpg.Connection]]

_RESET = "CREATE SCHEMA IF NOT EXISTS floor; DROP TABLE IF EXISTS floor.jobs"
_JOBS = """
CREATE TABLE floor.jobs (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    queue text NOT NULL,
    payload jsonb NOT NULL,
    run_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX jobs_queue_run_at_id ON floor.jobs (queue, run_at, id)
"""
_JOBS_WITH_STATE = """
CREATE TABLE floor.jobs (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    queue text NOT NULL,
    payload jsonb NOT NULL,
    run_at timestamptz NOT NULL DEFAULT now(),
    state text NOT NULL DEFAULT 'available'
);
CREATE INDEX jobs_available ON floor.jobs (queue, run_at, id) WHERE state = 'available'
"""
_INSERT_UNNEST = (
    "INSERT INTO floor.jobs (queue, payload) SELECT * FROM unnest($1::text[], $2::jsonb[])"
)
_INSERT_ONE = "INSERT INTO floor.jobs (queue, payload) VALUES ($1, $2)"
_NOTIFY = "SELECT pg_notify($1, $2)"
_DRAIN_DELETE = """
DELETE FROM floor.jobs WHERE id IN (
    SELECT id FROM floor.jobs WHERE queue = $1
    ORDER BY run_at, id LIMIT $2 FOR UPDATE SKIP LOCKED
) RETURNING id
"""
# 'available' stays a literal: as a parameter, a generic plan could not use the partial index.
_DRAIN_UPDATE = """
UPDATE floor.jobs SET state = 'done' WHERE id IN (
    SELECT id FROM floor.jobs WHERE queue = $1 AND state = 'available'
    ORDER BY run_at, id LIMIT $2 FOR UPDATE SKIP LOCKED
) RETURNING id
"""
_CLAIM_ONE = """
DELETE FROM floor.jobs WHERE id = (
    SELECT id FROM floor.jobs WHERE queue = $1
    ORDER BY run_at, id LIMIT 1 FOR UPDATE SKIP LOCKED
) RETURNING id
"""

_ANALYZE_JOBS = "ANALYZE floor.jobs"
_ANALYZE_RUNS_TASKS = "ANALYZE floor.runs, floor.tasks"
# The two-table floors: floor.runs and floor.tasks, copies of Cyclone's tables.
_TWO_TABLES_RESET = (
    "CREATE SCHEMA IF NOT EXISTS floor; DROP TABLE IF EXISTS floor.runs, floor.tasks"
)
_TABLE_OPTIONS = """
SELECT array_to_string(reloptions, ', ') FROM pg_class
WHERE oid = to_regclass(quote_ident($1) || '.' || quote_ident($2))
"""
_INSERT_RUNS_TASKS = """
WITH run AS (
    INSERT INTO floor.runs (id, name, job, input, queue, nodes, remaining, max_attempts)
    SELECT i.id, 'floor', true, i.input, $3, 1, 1, 3
    FROM ROWS FROM (unnest($1::uuid[]), jsonb_array_elements($2::jsonb)) AS i (id, input)
)
INSERT INTO floor.tasks (run_id, kind, queue, max_attempts)
SELECT i.id, 'floor', $3, 3 FROM unnest($1::uuid[]) AS i (id)
"""
_CLAIM_RUNS_TASKS = """
WITH async_commit AS (
    SELECT set_config('synchronous_commit', 'off', true)
), chosen AS (
    SELECT run_id, id FROM floor.tasks
    WHERE state = 'available' AND queue = $1 AND group_key = '' AND available_at <= now()
    ORDER BY priority DESC, available_at, id LIMIT $2
    FOR UPDATE SKIP LOCKED
)
UPDATE floor.tasks t
SET state = 'running', attempt = t.attempt + 1, claims = t.claims + 1,
    lease_until = now() + interval '30 seconds', worker = 'floor', started_at = now()
FROM chosen, async_commit
WHERE t.run_id = chosen.run_id AND t.id = chosen.id
RETURNING t.run_id, t.id, t.claims, (SELECT r.input FROM floor.runs r WHERE r.id = t.run_id)
"""
_COMPLETE_RUNS_TASKS = """
WITH done AS (
    DELETE FROM floor.tasks t
    USING unnest($1::uuid[], $2::bigint[], $3::int[]) AS c (run_id, id, claims)
    WHERE t.run_id = c.run_id AND t.id = c.id AND t.claims = c.claims AND t.state = 'running'
    RETURNING t.run_id, t.attempt
)
UPDATE floor.runs r
SET state = 'completed', output = 'null', remaining = 0, attempts = d.attempt,
    finished_at = now()
FROM done d
WHERE r.id = d.run_id
"""


@dataclass(frozen=True)
class Figure:
    """One measured number."""

    name: str
    value: float
    unit: str
    detail: str = ""


def _payloads(n: int) -> list[str]:
    """n small JSON documents as text."""
    return [f'{{"i": {i}}}' for i in range(n)]


def _chunks(n: int, batch: int) -> list[list[str]]:
    """n payloads split into lists of at most batch."""
    payloads = _payloads(n)
    return [payloads[lo : lo + batch] for lo in range(0, n, batch)]


@contextlib.asynccontextmanager
async def _jobs_table(pool: asyncpg.Pool, ddl: str = _JOBS) -> AsyncIterator[None]:
    """Recreate floor.jobs from ddl for the duration of the block, then drop it."""
    await pool.execute(_RESET)
    await pool.execute(ddl)
    try:
        yield
    finally:
        await pool.execute("DROP TABLE floor.jobs")


async def _insert_unnest(conn: asyncpg.pool.PoolConnectionProxy, chunks: list[list[str]]) -> None:
    """Insert each chunk of payloads with one unnest INSERT."""
    for chunk in chunks:
        await conn.execute(_INSERT_UNNEST, [QUEUE] * len(chunk), chunk)


Load = Callable[[asyncpg.pool.PoolConnectionProxy, list[list[str]]], Awaitable[None]]


async def _timed_load(
    pool: asyncpg.Pool,
    tables: contextlib.AbstractAsyncContextManager[None],
    load: Load,
    n: int,
    batch: int,
) -> float:
    """Seconds that ``load`` takes to write n payloads in chunks of batch, in ``tables``."""
    chunks = _chunks(n, batch)
    async with tables, pool.acquire() as conn:
        start = time.perf_counter()
        await load(conn, chunks)
        return time.perf_counter() - start


async def insert_unnest(pool: asyncpg.Pool, n: int = 10_000, batch: int = 1_000) -> Figure:
    """Batched INSERT ... SELECT FROM unnest, one commit per batch; rows/s."""
    elapsed = await _timed_load(pool, _jobs_table(pool), _insert_unnest, n, batch)
    return Figure("insert_unnest", n / elapsed, "rows/s", f"n={n} batch={batch}")


async def insert_copy(pool: asyncpg.Pool, n: int = 10_000, batch: int = 1_000) -> Figure:
    """Batched binary COPY via copy_records_to_table; rows/s."""
    batches = [[(QUEUE, payload) for payload in chunk] for chunk in _chunks(n, batch)]
    async with _jobs_table(pool), pool.acquire() as conn:
        start = time.perf_counter()
        for records in batches:
            await conn.copy_records_to_table(
                "jobs", schema_name="floor", columns=("queue", "payload"), records=records
            )
        elapsed = time.perf_counter() - start
    return Figure("insert_copy", n / elapsed, "rows/s", f"n={n} batch={batch}")


async def has_cyclone_tables(pool: asyncpg.Pool) -> bool:
    """Whether Cyclone's tables are in CYCLONE_SCHEMA, for the two-table floors to copy."""
    found = await pool.fetchval(
        "SELECT to_regclass(quote_ident($1) || '.cyclone_tasks')", CYCLONE_SCHEMA
    )
    return found is not None


@contextlib.asynccontextmanager
async def _runs_tasks_tables(pool: asyncpg.Pool) -> AsyncIterator[None]:
    """floor.runs and floor.tasks as copies of Cyclone's tables for the block, then dropped."""
    await pool.execute(_TWO_TABLES_RESET)
    for copy, table in (("runs", "cyclone_runs"), ("tasks", "cyclone_tasks")):
        source = f"{CYCLONE_SCHEMA}.{table}"
        await pool.execute(f"CREATE TABLE floor.{copy} (LIKE {source} INCLUDING ALL)")
        # LIKE copies no storage parameters (the task table's fillfactor, for one).
        if options := await pool.fetchval(_TABLE_OPTIONS, CYCLONE_SCHEMA, table):
            await pool.execute(f"ALTER TABLE floor.{copy} SET ({options})")
    try:
        yield
    finally:
        await pool.execute("DROP TABLE floor.runs, floor.tasks")


def _ordered_ids(n: int) -> list[uuid.UUID]:
    """n ids counting up from a random start, as time-ordered ids insert at the key's edge."""
    first = uuid.uuid4().int & ~((1 << 64) - 1)
    return [uuid.UUID(int=first + i) for i in range(n)]


async def _insert_runs_tasks(
    conn: asyncpg.pool.PoolConnectionProxy, chunks: list[list[str]]
) -> None:
    """Insert each chunk of payloads as jobs of the two tables, one statement a chunk (the
    chunk's payloads as one JSON array: one parameter, not an array of texts)."""
    ids = _ordered_ids(sum(len(chunk) for chunk in chunks))
    arrays = ["[" + ",".join(chunk) + "]" for chunk in chunks]
    lo = 0
    for chunk, array in zip(chunks, arrays, strict=True):
        await conn.execute(_INSERT_RUNS_TASKS, ids[lo : lo + len(chunk)], array, QUEUE)
        lo += len(chunk)


async def insert_runs_tasks(pool: asyncpg.Pool, n: int = 10_000, batch: int = 1_000) -> Figure:
    """insert_unnest into copies of Cyclone's two tables: a run and a task per job; jobs/s."""
    elapsed = await _timed_load(pool, _runs_tasks_tables(pool), _insert_runs_tasks, n, batch)
    return Figure("insert_runs_tasks", n / elapsed, "jobs/s", f"n={n} batch={batch}")


async def drain_runs_tasks(
    pool: asyncpg.Pool, n: int = 10_000, clients: int = CLIENTS, batch: int = 10
) -> Figure:
    """drain_delete on copies of Cyclone's two tables: each client claims a batch (a lease,
    no WAL flush wait, the runs read by key) and completes it durably (the tasks it still
    owns deleted, their runs completed); jobs/s."""

    async def claim_and_complete(conn: asyncpg.pool.PoolConnectionProxy, batch: int) -> int:
        if rows := await conn.fetch(_CLAIM_RUNS_TASKS, QUEUE, batch):
            run_ids, ids, claims = zip(*((r[0], r[1], r[2]) for r in rows), strict=True)
            await conn.execute(_COMPLETE_RUNS_TASKS, run_ids, ids, claims)
        return len(rows)

    tables, load, analyze = _runs_tasks_tables(pool), _insert_runs_tasks, _ANALYZE_RUNS_TASKS
    return await _drain(
        pool, "drain_runs_tasks", tables, load, analyze, claim_and_complete, n, clients, batch
    )


async def insert_single(pool: asyncpg.Pool, n: int = 2_000) -> Figure:
    """Sequential one-row INSERTs, each acquiring, committing and releasing; calls/s."""
    payloads = _payloads(n)
    async with _jobs_table(pool):
        start = time.perf_counter()
        for payload in payloads:
            async with pool.acquire() as conn:
                await conn.execute(_INSERT_ONE, QUEUE, payload)
        elapsed = time.perf_counter() - start
    return Figure("insert_single", n / elapsed, "calls/s", f"n={n} sequential")


async def _insert_notify(pool: asyncpg.Pool, payloads: list[str]) -> float:
    """Sequential transactions of one INSERT and one NOTIFY on one connection; seconds."""
    async with pool.acquire() as conn:
        start = time.perf_counter()
        for payload in payloads:
            async with conn.transaction():
                await conn.execute(_INSERT_ONE, QUEUE, payload)
                await conn.execute(_NOTIFY, CHANNEL, QUEUE)
        return time.perf_counter() - start


async def insert_notify(pool: asyncpg.Pool, n: int = 2_000) -> Figure:
    """Sequential transactions of one INSERT and one NOTIFY on one connection; calls/s."""
    payloads = _payloads(n)
    async with _jobs_table(pool):
        elapsed = await _insert_notify(pool, payloads)
    return Figure("insert_notify", n / elapsed, "calls/s", f"n={n} one connection")


async def insert_notify_consumed(pool: asyncpg.Pool, connect: Connect, n: int = 2_000) -> Figure:
    """insert_notify while a consumer in this process, on its own LISTENing connection, takes
    each job as it is notified with one durable DELETE (claim and completion in one statement:
    the least any consumer does); calls/s over the inserts alone, as enqueue+worker's."""
    payloads = _payloads(n)
    notified = asyncio.Event()
    async with _jobs_table(pool):
        listener = await connect()

        async def consume() -> None:
            taken = 0
            while taken < n:
                await notified.wait()
                notified.clear()
                while await listener.fetchrow(_CLAIM_ONE, QUEUE) is not None:
                    taken += 1

        try:
            await listener.add_listener(CHANNEL, lambda *_: notified.set())
            consumer = asyncio.create_task(consume())
            elapsed = await _insert_notify(pool, payloads)
            await asyncio.wait_for(consumer, 600)
        finally:
            await listener.close()
    return Figure(
        "insert_notify_consumed",
        n / elapsed,
        "calls/s",
        f"n={n} one connection, each job DELETEd by a listener in this process",
    )


# One batch of a drain client on its connection: how many jobs it took (0: none left).
Batch = Callable[[asyncpg.pool.PoolConnectionProxy, int], Awaitable[int]]


def _claiming(claim: str) -> Batch:
    """A batch that is one statement: claim (and complete) up to batch jobs."""

    async def batch_of(conn: asyncpg.pool.PoolConnectionProxy, batch: int) -> int:
        return len(await conn.fetch(claim, QUEUE, batch))

    return batch_of


async def _drain(
    pool: asyncpg.Pool,
    name: str,
    tables: contextlib.AbstractAsyncContextManager[None],
    load: Load,
    analyze: str,
    run: Batch,
    n: int,
    clients: int,
    batch: int,
) -> Figure:
    """Prefill n jobs into ``tables`` with ``load``, run ``analyze``, then time clients
    running batches until one takes nothing; jobs/s."""

    async def client() -> int:
        taken = 0
        async with pool.acquire() as conn:
            while took := await run(conn, batch):
                taken += took
        return taken

    async with tables:
        async with pool.acquire() as conn:
            await load(conn, _chunks(n, PREFILL_BATCH))
            await conn.execute(analyze)
        start = time.perf_counter()
        taken = await asyncio.gather(*(client() for _ in range(clients)))
        elapsed = time.perf_counter() - start
    if sum(taken) != n:
        raise RuntimeError(f"{name}: took {sum(taken)} jobs, expected {n}")
    return Figure(name, n / elapsed, "jobs/s", f"n={n} clients={clients} batch={batch}")


async def drain_delete(
    pool: asyncpg.Pool, n: int = 10_000, clients: int = CLIENTS, batch: int = 10
) -> Figure:
    """Concurrent SKIP LOCKED claim-and-DELETE of n jobs; jobs/s."""
    tables, run = _jobs_table(pool), _claiming(_DRAIN_DELETE)
    load = _insert_unnest
    return await _drain(pool, "drain_delete", tables, load, _ANALYZE_JOBS, run, n, clients, batch)


async def drain_update(
    pool: asyncpg.Pool, n: int = 10_000, clients: int = CLIENTS, batch: int = 10
) -> Figure:
    """Concurrent SKIP LOCKED claim-and-UPDATE to 'done' of n jobs, rows kept; jobs/s."""
    tables, run = _jobs_table(pool, _JOBS_WITH_STATE), _claiming(_DRAIN_UPDATE)
    load = _insert_unnest
    return await _drain(pool, "drain_update", tables, load, _ANALYZE_JOBS, run, n, clients, batch)


async def wake_latency(
    pool: asyncpg.Pool, connect: Connect, samples: int = 200, warmup: int = 10
) -> tuple[Figure, Figure]:
    """Commit-to-claim latency over LISTEN/NOTIFY, strictly sequential; p50 and p99 in ms."""
    loop = asyncio.get_running_loop()
    waiter: asyncio.Future[float] = loop.create_future()
    latencies: list[float] = []

    async with _jobs_table(pool):
        listener = await connect()

        async def on_notify(*_: object) -> None:
            """Claim the notified job on the listener connection; resolve waiter with the time."""
            try:
                row = await listener.fetchrow(_CLAIM_ONE, QUEUE)
                if row is None:
                    raise RuntimeError("notified, but no job to claim")
            except Exception as exc:
                waiter.set_exception(exc)
            else:
                waiter.set_result(time.perf_counter())

        try:
            await listener.add_listener(CHANNEL, on_notify)
            async with pool.acquire() as producer:
                for i in range(warmup + samples):
                    waiter = loop.create_future()
                    async with producer.transaction():
                        await producer.execute(_INSERT_ONE, QUEUE, f'{{"i": {i}}}')
                        await producer.execute(_NOTIFY, CHANNEL, QUEUE)
                        committing = time.perf_counter()  # COMMIT runs as the block exits
                    async with asyncio.timeout(10):
                        claimed = await waiter
                    if i >= warmup:
                        latencies.append((claimed - committing) * 1_000)
        finally:
            await listener.close()

    detail = f"samples={samples} warmup={warmup}"
    p99 = statistics.quantiles(latencies, n=100)[98]
    return (
        Figure("wake_p50", statistics.median(latencies), "ms", detail),
        Figure("wake_p99", p99, "ms", detail),
    )


async def run_all(pool: asyncpg.Pool, connect: Connect) -> list[Figure]:
    """Run every floor in order with default sizes."""
    figures = [
        await insert_unnest(pool),
        await insert_copy(pool),
        await insert_single(pool),
        await insert_notify(pool),
        await insert_notify_consumed(pool, connect),
        await drain_delete(pool),
        await drain_update(pool),
    ]
    if await has_cyclone_tables(pool):
        figures += [await insert_runs_tasks(pool), await drain_runs_tasks(pool)]
    figures.extend(await wake_latency(pool, connect))
    return figures


async def _main(dsn: str) -> None:
    async def connect() -> asyncpg.Connection:
        return await asyncpg.connect(dsn)

    async with asyncpg.create_pool(dsn, min_size=CLIENTS, max_size=CLIENTS) as pool:
        figures = await run_all(pool, connect)
    for figure in figures:
        print(f"{figure.name:<14} {figure.value:>12,.2f}  {figure.unit:<8} {figure.detail}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="Raw asyncpg floor benchmarks.")
    parser.add_argument("--dsn", required=True, help="scratch database to create schema floor in")
    asyncio.run(_main(parser.parse_args().dsn))
