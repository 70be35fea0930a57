"""What a web app with an embedded worker sees: one process holds the worker and the enqueuer.

- ``drain``: a prefilled queue drained by one worker started in this process, with the
  library's defaults except the queue's concurrency; jobs/s from the worker's start until every
  outcome is written. With ``sync``, of plain ``def`` no-op handlers, each run in a thread.
- ``stale_drain``: the same after a burst of enqueues into an empty queue over a long run
  history, once with statistics taken before the burst (autovacuum off, no ANALYZE since) and
  once after an ANALYZE; the claim's plan in each state.
- ``enqueue_with_worker``: sequential ``enqueue`` calls while the worker runs the jobs.
"""

from __future__ import annotations

import asyncio
import time

import asyncpg

import cyclone
from benchmarks import history
from benchmarks.floor import Figure
from benchmarks.jobs import QUEUE, handled, noop, noop_sync, truncate

BATCH = 1_000  # prefill batches of enqueue_many


async def _prefill(client: cyclone.Client, n: int, step: cyclone.Step[int, None] = noop) -> None:
    for lo in range(0, n, BATCH):
        await step.enqueue_many(client, list(range(lo, min(n, lo + BATCH))))


async def _run_worker(
    client: cyclone.Client, n: int, concurrency: int, cap: float | None
) -> tuple[int, float]:
    """Drain n queued jobs with one worker; (jobs handled, seconds). A cap stops it early."""
    handled.arm(n)
    start = time.perf_counter()
    async with cyclone.Worker(client, steps=[noop], queues={QUEUE: concurrency}) as worker:
        try:
            await asyncio.wait_for(handled.done.wait(), cap)
        except TimeoutError:
            return handled.count, time.perf_counter() - start
        await worker.drain()  # every outcome written
        return n, time.perf_counter() - start


async def _run_sync_worker(client: cyclone.Client, concurrency: int) -> float:
    """Drain the queued plain ``def`` jobs with one worker; seconds."""
    start = time.perf_counter()
    async with cyclone.Worker(client, steps=[noop_sync], queues={QUEUE: concurrency}) as worker:
        await worker.drain()  # nothing claimable left and every outcome written
    return time.perf_counter() - start


async def drain(
    pool: asyncpg.Pool, n: int = 10_000, concurrency: int = 16, *, sync: bool = False
) -> Figure:
    """n no-op jobs drained by one worker embedded in this process; jobs/s. ``sync``: of a
    plain ``def`` handler, run in a thread each."""
    client = cyclone.Client(pool)
    await truncate(pool)
    await _prefill(client, n, noop_sync if sync else noop)
    await pool.execute("VACUUM ANALYZE")
    if sync:
        done, seconds = n, await _run_sync_worker(client, concurrency)
    else:
        done, seconds = await _run_worker(client, n, concurrency, None)
    await truncate(pool)
    kind = ", plain def handlers in threads" if sync else ""
    return Figure(
        f"drain c{concurrency}{' sync' if sync else ''}",
        done / seconds,
        "jobs/s",
        f"n={n}, worker in this process, queue concurrency {concurrency}{kind}",
    )


async def stale_drain(
    pool: asyncpg.Pool, dsn: str, n: int, concurrency: int, *, analyze: bool, cap: float
) -> tuple[Figure, dict[str, str]]:
    """Burst of n enqueues into the empty queue over the history already built, then a drain,
    with or without ANALYZE in between; jobs/s, and the claim's plans right before the drain.
    Stops after ``cap`` seconds (a stale plan can be very slow) and counts what was done."""
    client = cyclone.Client(pool)
    await pool.execute("DELETE FROM cyclone_tasks")
    await pool.execute("DELETE FROM cyclone_runs WHERE state = 'pending'")  # a capped drain's
    await pool.execute("VACUUM ANALYZE cyclone_runs, cyclone_tasks")
    await _prefill(client, n)
    if analyze:
        await pool.execute("ANALYZE cyclone_runs, cyclone_tasks")
    plans = await history.claim_plan(dsn, concurrency)
    done, seconds = await _run_worker(client, n, concurrency, cap)
    label = "analyzed" if analyze else "stale"
    detail = f"n={n}, {label} statistics, queue concurrency {concurrency}"
    if done < n:
        detail += f", stopped at {cap:.0f} s after {done} jobs"
    return Figure(f"drain c{concurrency} {label}", done / seconds, "jobs/s", detail), plans


async def enqueue_with_worker(pool: asyncpg.Pool, n: int = 2_000, concurrency: int = 16) -> Figure:
    """Sequential ``enqueue`` calls, each its own transaction, while a worker in this process
    runs them; calls/s over the calls alone."""
    client = cyclone.Client(pool)
    await truncate(pool)
    handled.arm(n)
    async with cyclone.Worker(client, steps=[noop], queues={QUEUE: concurrency}) as worker:
        start = time.perf_counter()
        for i in range(n):
            await noop.enqueue(client, i)
        elapsed = time.perf_counter() - start
        await asyncio.wait_for(handled.done.wait(), 600)
        await worker.drain()
    await truncate(pool)
    return Figure(
        "enqueue+worker", n / elapsed, "calls/s", f"n={n}, worker in this process running them"
    )
