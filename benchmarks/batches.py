"""Batch drains: the drain benchmark's jobs as a batch step of 100 per call, beside the same
jobs one handler call each, drained by one worker embedded in this process.

- ``drain``: no-op jobs (as ``embedded.drain``), batched; beside ``drain c200``.
- ``write_drain``: each job writes one row in its completion transaction, one call per job
  (``plain``) or one ``INSERT`` and one commit per batch.

Both run at the queue concurrency a user sets for ``max_size=100``: 200 slots, so that one
batch collects while the previous one runs.
"""

from __future__ import annotations

import time
from typing import Any

import asyncpg

import cyclone
from benchmarks.floor import Figure
from benchmarks.jobs import QUEUE, Tally, truncate

SIZE = 100
CONCURRENCY = 2 * SIZE
BATCH = 1_000  # prefill batches of enqueue_many

handled = Tally()


@cyclone.batch_action("bench.batch", queue=QUEUE, max_size=SIZE, max_wait=1.0)
async def noop_batch(ctx: cyclone.BatchContext, items: list[int]) -> None:
    for _ in items:
        handled.hit()


@cyclone.action("bench.write", queue=QUEUE)
async def write_one(ctx: cyclone.Context, i: int) -> None:
    conn = await ctx.completion_tx()
    await conn.execute("INSERT INTO bench_rows (i) VALUES ($1)", i)
    handled.hit()


@cyclone.batch_action("bench.write_batch", queue=QUEUE, max_size=SIZE, max_wait=1.0)
async def write_batch(ctx: cyclone.BatchContext, items: list[int]) -> None:
    conn = await ctx.completion_tx()
    await conn.execute("INSERT INTO bench_rows (i) SELECT unnest($1::int[])", items)
    for _ in items:
        handled.hit()


async def _drain(pool: asyncpg.Pool, step: cyclone.Step[int, Any], n: int, c: int) -> float:
    """n jobs of ``step`` drained by one worker in this process; jobs/s from the worker's
    start until every outcome is written."""
    client = cyclone.Client(pool)
    await truncate(pool)
    await pool.execute("CREATE TABLE IF NOT EXISTS bench_rows (i int); TRUNCATE bench_rows")
    for lo in range(0, n, BATCH):
        await step.enqueue_many(client, list(range(lo, min(n, lo + BATCH))))
    await pool.execute("VACUUM ANALYZE")
    handled.arm(n)
    start = time.perf_counter()
    async with cyclone.Worker(client, steps=[step], queues={QUEUE: c}) as worker:
        await handled.done.wait()
        await worker.drain()  # every outcome written
        seconds = time.perf_counter() - start
    await truncate(pool)
    await pool.execute("DROP TABLE bench_rows")
    return n / seconds


async def drain(pool: asyncpg.Pool, n: int = 10_000, concurrency: int = CONCURRENCY) -> Figure:
    """No-op jobs drained in batches of up to SIZE; jobs/s."""
    return Figure(
        f"batch drain c{concurrency}",
        await _drain(pool, noop_batch, n, concurrency),
        "jobs/s",
        f"n={n}, batch step max_size={SIZE}, worker in this process, queue concurrency "
        f"{concurrency}",
    )


async def write_drain(
    pool: asyncpg.Pool, n: int = 10_000, *, batched: bool, concurrency: int = CONCURRENCY
) -> Figure:
    """Jobs writing one row each in their completion transaction; jobs/s."""
    step: cyclone.Step[int, None] = write_batch if batched else write_one
    how = f"batch step max_size={SIZE}" if batched else "one call per job"
    return Figure(
        f"{'batch ' if batched else ''}write drain c{concurrency}",
        await _drain(pool, step, n, concurrency),
        "jobs/s",
        f"n={n}, a row per job in the completion transaction, {how}, queue concurrency "
        f"{concurrency}",
    )
