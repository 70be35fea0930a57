"""Claim, list and purge over a long history: ``python -m benchmarks.storage [--history N]``.

Measures the same operations over a small history (``--small``, 70,000 finished runs by
default) and over a long one (``--history``, 10 million by default: a week at about 16 runs
a second), in one run on one server, and prints each as a ratio of the two:

- claim: a burst of 5,000 jobs enqueued and drained by an embedded worker at concurrency 16,
  statistics refreshed (``ANALYZE``) after the burst; jobs/s;
- list_runs: the first page (50 runs), a page deep in the history (keyset cursor at its
  middle), the first page by name, and by a state no run of the history has (``failed``: the
  walk reads the whole history, the worst case ``RunQuery`` documents); median ms of 5;
- purge: the oldest seventh of the history (a day of a week) purged as the retention sweeper
  does, in batches of 1,000; runs/s, and the ``VACUUM`` of the runs table afterwards;
- sizes: the runs table's heap and indexes.

The history is written by ``benchmarks.history.build_history``. Check the disk first: 10
million runs take about 6 GB.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import functools
import os
import statistics
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import asyncpg

import cyclone
from benchmarks import embedded, history, report
from benchmarks.jobs import truncate
from cyclone.testing import describe, postgres_server

PAGE = 50
_SIZE = "SELECT pg_table_size('cyclone_runs'), pg_indexes_size('cyclone_runs')"


@dataclass(frozen=True)
class Figures:
    """One history's measurements, by name: (value, unit)."""

    history: int
    values: dict[str, tuple[float, str]]


async def _median_ms(call: Callable[[], Awaitable[object]], repeat: int = 5) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        await call()
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


async def measure_history(pool: asyncpg.Pool, dsn: str, n: int) -> Figures:
    """Build a history of ``n`` finished runs and measure over it."""
    await truncate(pool)
    start = time.perf_counter()
    await history.build_history(pool, n)
    built = time.perf_counter() - start
    print(f"# {n:,} finished runs written and analyzed in {built:.0f} s", flush=True)
    client = cyclone.Client(pool)
    values: dict[str, tuple[float, str]] = {}
    sizes = await pool.fetchrow(_SIZE)
    assert sizes is not None
    heap, indexes = sizes
    values["runs heap"] = (heap / 2**20, "MB")
    values["runs indexes"] = (indexes / 2**20, "MB")
    claim, _ = await embedded.stale_drain(pool, dsn, 5_000, 16, analyze=True, cap=120)
    values["claim (drain c16)"] = (claim.value, "jobs/s")
    await pool.execute("DELETE FROM cyclone_runs WHERE state = 'pending'")  # none: all drained
    middle = await pool.fetchval(
        "SELECT id FROM cyclone_runs ORDER BY id DESC OFFSET $1 LIMIT 1", n // 2
    )
    queries = {
        "list first page": cyclone.RunQuery(limit=PAGE),
        "list deep keyset page": cyclone.RunQuery(limit=PAGE, cursor=str(middle)),
        "list by name": cyclone.RunQuery(limit=PAGE, name="bench.noop"),
        "list by state (none match)": cyclone.RunQuery(limit=PAGE, state=cyclone.RunState.FAILED),
    }
    for label, query in queries.items():
        values[label] = (await _median_ms(functools.partial(client.list_runs, query)), "ms")
    # The oldest seventh: everything that finished before the run at 6/7 from the newest.
    cutoff = await pool.fetchval(
        "SELECT finished_at FROM cyclone_runs ORDER BY finished_at DESC OFFSET $1 LIMIT 1",
        n - n // 7,
    )
    now = await pool.fetchval("SELECT now()")
    age = now - cutoff + dt.timedelta(microseconds=1)
    start = time.perf_counter()
    purged = await client.services.runs.purge(
        [(cyclone.RunState.COMPLETED, age)], 1000, batches=None
    )
    seconds = time.perf_counter() - start
    values["purge a seventh"] = (purged / seconds, "runs/s")
    start = time.perf_counter()
    await pool.execute("VACUUM cyclone_runs", timeout=3600)
    values["VACUUM after the purge"] = (time.perf_counter() - start, "s")
    await truncate(pool)
    return Figures(n, values)


def render(small: Figures, large: Figures) -> str:
    rows = []
    for label, (value, unit) in small.values.items():
        big, _ = large.values[label]
        ratio = big / value if value else float("nan")
        rows.append([label, f"{value:,.2f} {unit}", f"{big:,.2f} {unit}", f"{ratio:.2f}"])
    header = ["figure", f"{small.history:,} runs", f"{large.history:,} runs", "ratio"]
    return report.table(header, rows)


async def measure(dsn: str, small: int, large: int) -> str:
    async with asyncpg.create_pool(dsn, min_size=2, max_size=20) as pool:
        await cyclone.Client(pool).migrate()
        a = await measure_history(pool, dsn, small)
        b = await measure_history(pool, dsn, large)
    return render(a, b)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--dsn", default=os.environ.get("CYCLONE_BENCH_DSN"))
    parser.add_argument("--history", type=int, default=10_000_000)
    parser.add_argument("--small", type=int, default=70_000)
    args = parser.parse_args()
    if args.dsn:
        print(asyncio.run(measure(args.dsn, args.small, args.history)))
        return
    with postgres_server(env_var="CYCLONE_BENCH_DSN", durable=True) as server:
        print(f"# {describe(server)}, durable settings")
        print(asyncio.run(measure(server.dsn, args.small, args.history)))


if __name__ == "__main__":
    main()
