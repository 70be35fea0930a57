"""Schedule figures: ``python -m benchmarks.schedules [--dsn DSN] [--slots 60] [--idle 30]``.

- Lag from each slot of an every-second schedule to its handler's start, p50 and p99 over
  ``--slots`` slots, on one worker.
- What 1,000 declared schedules cost an idle worker: transactions per second the server
  counted (``pg_stat_database.xact_commit + xact_rollback``; each statement of an idle worker
  is its own transaction) over ``--idle`` seconds, with and without them, as a ratio.

Without ``--dsn`` (or ``CYCLONE_BENCH_DSN``) it starts a throwaway server.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import os
import statistics
import time

import asyncpg

import cyclone
from cyclone.testing import describe, postgres_server

lags: list[float] = []
enough = asyncio.Event()
wanted = 60


@cyclone.action("bench.sched.tick", queue="bench-sched")
async def tick(ctx: cyclone.Context, slot: float) -> None:
    lags.append(time.time() - slot)
    if len(lags) >= wanted:
        enough.set()


@cyclone.action("bench.sched.idle", queue="bench-sched")
async def idle(ctx: cyclone.Context, n: int) -> None:
    return None


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def lag(pool: asyncpg.Pool, slots: int) -> tuple[float, float]:
    """p50 and p99 (ms) from slot time to handler start, over ``slots`` slots."""
    global wanted
    wanted = slots
    client = cyclone.Client(pool)
    every = cyclone.schedule(
        "bench.every-second",
        tick,
        every=dt.timedelta(seconds=1),
        input=lambda slot: slot.timestamp(),
    )
    async with cyclone.Worker(client, steps=[tick], schedules=[every]):
        await asyncio.wait_for(enough.wait(), slots * 3 + 30)
    ms = [x * 1000 for x in lags[:slots]]
    return statistics.median(ms), _percentile(ms, 0.99)


async def _transactions(pool: asyncpg.Pool) -> int:
    await pool.execute("SELECT pg_stat_force_next_flush()")
    value: int = await pool.fetchval(
        "SELECT xact_commit + xact_rollback FROM pg_stat_database"
        " WHERE datname = current_database()"
    )
    return value


async def idle_rate(
    pool: asyncpg.Pool, schedules: list[cyclone.Schedule[int]], seconds: float
) -> float:
    """Transactions per second with one idle worker declaring ``schedules``."""
    client = cyclone.Client(pool)
    async with cyclone.Worker(client, steps=[idle], schedules=schedules):
        await asyncio.sleep(2)  # past start-up
        before, started = await _transactions(pool), time.monotonic()
        await asyncio.sleep(seconds)
        after, elapsed = await _transactions(pool), time.monotonic() - started
    return (after - before - 2) / elapsed  # less this benchmark's own two reads


async def measure(dsn: str, slots: int, idle_seconds: float) -> str:
    async with asyncpg.create_pool(dsn, min_size=1, max_size=8) as pool:
        await cyclone.Client(pool).migrate()
        p50, p99 = await lag(pool, slots)
        # Daily slots spread over the day: none falls due while the worker idles.
        many = [
            cyclone.schedule(f"bench.daily.{i}", idle, cron=f"{i % 60} {i % 24} * * *", input=i)
            for i in range(1000)
        ]
        bare = await idle_rate(pool, [], idle_seconds)
        loaded = await idle_rate(pool, many, idle_seconds)
    return "\n".join(
        [
            f"slot to handler start over {slots} slots: p50 {p50:.1f} ms, p99 {p99:.1f} ms",
            f"idle worker, transactions/s: {bare:.2f} without schedules, "
            f"{loaded:.2f} with 1,000 declared; ratio {loaded / bare:.2f}",
        ]
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--dsn", default=os.environ.get("CYCLONE_BENCH_DSN"))
    parser.add_argument("--slots", type=int, default=60)
    parser.add_argument("--idle", type=float, default=30.0)
    args = parser.parse_args()
    if args.dsn:
        print(asyncio.run(measure(args.dsn, args.slots, args.idle)))
        return
    with postgres_server(env_var="CYCLONE_BENCH_DSN", durable=True) as server:
        print(f"# {describe(server)}, durable settings")
        print(asyncio.run(measure(server.dsn, args.slots, args.idle)))


if __name__ == "__main__":
    main()
