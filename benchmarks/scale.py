"""Many worker processes on one database: ``python -m benchmarks.scale [--dsn DSN] [--quick]``.

For 1, 2, 4 and 8 worker processes (``benchmarks.fleet``) sharing the same total queue
concurrency, on one PostgreSQL:

- drain: a prefilled queue of no-op jobs, jobs/s from the workers' go to no task left;
- drain after a resume: the same, the queue paused while the workers start (each claims and
  finds it paused), jobs/s from ``client.queues.resume`` to no task left;
- sustained: a producer in this process keeps a backlog (``enqueue_many`` batches whenever
  fewer than two batches are claimable) while the workers run; completed jobs/s over the
  window, by the server's clock;
- wait events: ``pg_stat_activity`` sampled every 20 ms during both, as the share of active
  backends' samples per wait event (a lock convoy shows as Lock or LWLock waits);
- idle maintenance: 8 workers with nothing to do and a client ``retention`` on (so every
  pass sweeps too), statements per second from ``pg_stat_statements`` and commits per
  second from ``pg_stat_database``.

Without ``--dsn`` it starts a throwaway server with durable settings and
``pg_stat_statements`` loaded (a server of yours must preload it).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import os
import re
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field, replace
from importlib import resources

import asyncpg

import cyclone
from benchmarks import report
from benchmarks.fleet import Fleet
from benchmarks.jobs import QUEUE, noop, truncate
from cyclone._storage.loader import Queries, parse_folder
from cyclone.testing import describe, postgres_server

PROCESSES = (1, 2, 4, 8)
BATCH = 500
_ACTIVITY = """
SELECT coalesce(wait_event_type || ':' || wait_event, 'CPU') AS event, count(*)::int AS n
FROM pg_stat_activity
WHERE datname = current_database() AND pid <> pg_backend_pid() AND state = 'active'
  AND backend_type = 'client backend'
GROUP BY 1
"""
_STATEMENTS = """
SELECT query, calls, total_exec_time FROM pg_stat_statements
WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
"""
_CONSTANTS = re.compile(r"'[^']*'|\$\d+|\b\d+\b|\b(?:true|false)\b")
# asyncpg's reset of a connection released to its pool: one round trip of four statements.
_RESET = ("SELECT pg_advisory_unlock_all()", "CLOSE ALL", "UNLISTEN *", "RESET ALL")
_COMMITS = "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()"
# The statements of the maintenance pass (cyclone/_worker/maintenance.py); the rest of an idle
# worker's traffic is its claim polls, heartbeats and presence row.
MAINTENANCE = (
    "task_reclaim",
    "task_expired_exhausted",
    "run_deadline_due",
    "wait_expire_due",
    "run_purge",
)


@dataclass(frozen=True)
class Sizes:
    """How much each measurement does; ``--quick`` shrinks them."""

    jobs: int = 20_000  # drained per process count
    concurrency: int = 64  # total, split evenly between the processes
    seconds: float = 20.0  # sustained window
    idle: float = 30.0  # idle-maintenance window


QUICK = Sizes(jobs=4_000, seconds=6.0, idle=12.0)


@dataclass
class Waits:
    """Wait-event samples of active backends."""

    samples: int = 0
    counts: collections.Counter[str] = field(default_factory=collections.Counter)

    def share(self, prefix: str) -> float:
        total = sum(self.counts.values())
        return sum(n for e, n in self.counts.items() if e.startswith(prefix)) / max(total, 1)

    def active(self) -> float:
        """Active backends, on average over the samples."""
        return sum(self.counts.values()) / max(self.samples, 1)

    def top(self, n: int = 4) -> str:
        total = sum(self.counts.values()) or 1
        return ", ".join(f"{e} {c / total:.0%}" for e, c in self.counts.most_common(n))


@contextlib.asynccontextmanager
async def sampling(dsn: str, every: float = 0.02) -> AsyncIterator[Waits]:
    """Sample pg_stat_activity on a connection of its own while the block runs."""
    waits = Waits()
    conn = await asyncpg.connect(dsn)

    async def sample() -> None:
        while True:
            for row in await conn.fetch(_ACTIVITY):
                waits.counts[row["event"]] += row["n"]
            waits.samples += 1
            await asyncio.sleep(every)

    task = asyncio.create_task(sample())
    try:
        yield waits
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await conn.close()


async def _prefill(client: cyclone.Client, n: int) -> None:
    for lo in range(0, n, BATCH):
        await noop.enqueue_many(client, list(range(lo, min(n, lo + BATCH))))


async def _until_empty(pool: asyncpg.Pool, timeout: float = 900) -> None:
    deadline = time.perf_counter() + timeout
    while await pool.fetchval("SELECT count(*) FROM cyclone_tasks"):
        if time.perf_counter() > deadline:
            raise RuntimeError("the fleet did not drain the queue in time")
        await asyncio.sleep(0.05)


@dataclass
class Row:
    processes: int
    drain: float
    resumed: float  # the drain released by a resume
    sustained: float
    cost: Cost
    drain_waits: Waits
    sustained_waits: Waits


@dataclass
class Cost:
    """What a drain cost per job."""

    commits: float
    statements: float
    worker_cpu_ms: float  # the worker processes' CPU time
    top: str  # the most frequent statements, calls per job


async def _commits(pool: asyncpg.Pool) -> int:
    commits: int = await pool.fetchval(_COMMITS)
    return commits


async def drain(
    pool: asyncpg.Pool, dsn: str, processes: int, s: Sizes, *, resume: bool = False
) -> tuple[float, Waits, Cost]:
    """A prefilled queue drained by the fleet (released by a resume, if ``resume``); jobs/s,
    wait events and cost per job."""
    await truncate(pool)
    client = cyclone.Client(pool)
    if resume:
        await client.queues.pause(QUEUE, create=True)
    await _prefill(client, s.jobs)
    await pool.execute("VACUUM ANALYZE cyclone_runs, cyclone_tasks")
    async with Fleet(dsn, processes, s.concurrency) as fleet:
        if resume:
            fleet.go()
            await asyncio.sleep(1.0)  # each worker's first claims find the queue paused
        await pool.execute("SELECT pg_stat_statements_reset()")
        commits, cpu = await _commits(pool), fleet.cpu()
        async with sampling(dsn) as waits:
            start = time.perf_counter()
            if resume:
                await client.queues.resume(QUEUE)
            else:
                fleet.go()
            await _until_empty(pool)
            elapsed = time.perf_counter() - start
        cpu = fleet.cpu() - cpu
        await asyncio.sleep(1.5)  # backends flush their statistics about every second
        commits = await _commits(pool) - commits
        rows = await pool.fetch(_STATEMENTS)
    names = _names()
    calls: collections.Counter[str] = collections.Counter()
    for r in rows:
        if r["query"] in _RESET:  # four statements in one round trip: count it once
            if r["query"] == "RESET ALL":
                calls["pool reset"] += r["calls"]
            continue
        calls[names.get(_text(r["query"])) or _label(r["query"])] += r["calls"]
    top = ", ".join(f"{n} {c / s.jobs:.2f}" for n, c in calls.most_common(4))
    cost = Cost(commits / s.jobs, calls.total() / s.jobs, cpu * 1000 / s.jobs, top)
    return s.jobs / elapsed, waits, cost


async def sustained(pool: asyncpg.Pool, dsn: str, processes: int, s: Sizes) -> tuple[float, Waits]:
    """Completed jobs/s while a producer keeps a backlog of one to two batches."""
    await truncate(pool)
    client = cyclone.Client(pool)
    available = "SELECT count(*) FROM cyclone_tasks WHERE state = 'available'"
    async with Fleet(dsn, processes, s.concurrency) as fleet:
        fleet.go()
        n = 0
        end = time.perf_counter() + 2.0  # warm-up: connections and statement caches
        while time.perf_counter() < end:
            await noop.enqueue_many(client, list(range(n, n + BATCH)))
            n += BATCH
            await asyncio.sleep(0.05)
        async with sampling(dsn) as waits:
            t0 = await pool.fetchval("SELECT clock_timestamp()")
            end = time.perf_counter() + s.seconds
            while time.perf_counter() < end:
                if await pool.fetchval(available) < 2 * BATCH:
                    await noop.enqueue_many(client, list(range(n, n + BATCH)))
                    n += BATCH
                else:
                    await asyncio.sleep(0.005)
            t1 = await pool.fetchval("SELECT clock_timestamp()")
        done = await pool.fetchval(
            "SELECT count(*) FROM cyclone_runs WHERE state = 'completed'"
            " AND finished_at >= $1 AND finished_at < $2",
            t0,
            t1,
        )
        await _until_empty(pool)
    await truncate(pool)
    return done / (t1 - t0).total_seconds(), waits


@dataclass
class Idle:
    seconds: float
    commits: float  # per second
    statements: dict[str, tuple[float, float]]  # name -> (calls/s, server ms/s)


async def idle_maintenance(pool: asyncpg.Pool, dsn: str, processes: int, window: float) -> Idle:
    """Statements per second of ``processes`` idle workers with the retention sweeper on."""
    await truncate(pool)
    names = _names()
    async with Fleet(dsn, processes, processes, retention=86_400) as fleet:
        fleet.go()
        await asyncio.sleep(6.0)  # every worker has started and run a maintenance pass
        await pool.execute("SELECT pg_stat_statements_reset()")
        commits = await _commits(pool)
        start = time.perf_counter()
        await asyncio.sleep(window)
        rows = await pool.fetch(_STATEMENTS)
        elapsed = time.perf_counter() - start
        await asyncio.sleep(1.0)  # pg_stat_database is flushed by backends about every second
        commits = await _commits(pool) - commits
    per: dict[str, tuple[float, float]] = {}
    for r in rows:
        name = names.get(_text(r["query"]))
        if r["query"] == "RESET ALL":
            name = "pool reset"
        if name is None:
            continue  # this process's own statements
        calls, ms = per.get(name, (0.0, 0.0))
        per[name] = (calls + r["calls"] / elapsed, ms + r["total_exec_time"] / elapsed)
    return Idle(elapsed, commits / elapsed, per)


def _label(query: str) -> str:
    """A statement's name from its first line (``-- cyclone: <name>``), or its start."""
    first = query.split("\n", 1)[0]
    return first.removeprefix("-- cyclone: ") if first.startswith("-- cyclone: ") else first[:30]


def _names() -> dict[str, str]:
    """Cyclone's statements by their text as pg_stat_statements keeps it."""
    return {_text(Queries("public")[n]): n for n in parse_folder(_sql_folder())}


def _text(query: str) -> str:
    """A statement's text with what pg_stat_statements changes taken out: whitespace
    folded, no trailing semicolon, parameters and the constants it turns into parameters
    (strings, numbers, booleans) removed."""
    return _CONSTANTS.sub("", " ".join(query.split())).rstrip("; ")


def _sql_folder() -> resources.abc.Traversable:
    return resources.files("cyclone._storage").joinpath("sql")


def render(rows: Sequence[Row], idle: Idle, processes: int, s: Sizes) -> str:
    one = rows[0]
    table = report.table(
        [
            "processes",
            "drain jobs/s",
            "ratio to 1",
            "after a resume",
            "ratio to drain",
            "sustained jobs/s",
            "ratio to 1",
            "commits/job",
            "statements/job",
            "worker CPU ms/job",
            "active backends",
            "Lock",
            "LWLock",
            "top wait events (drain)",
        ],
        [
            [
                f"{r.processes} x c{s.concurrency // r.processes}",
                f"{r.drain:,.0f}",
                f"{r.drain / one.drain:.2f}",
                f"{r.resumed:,.0f}",
                f"{r.resumed / r.drain:.2f}",
                f"{r.sustained:,.0f}",
                f"{r.sustained / one.sustained:.2f}",
                f"{r.cost.commits:.3f}",
                f"{r.cost.statements:.3f}",
                f"{r.cost.worker_cpu_ms:.3f}",
                f"{r.drain_waits.active():.1f}",
                f"{r.drain_waits.share('Lock:'):.1%}",
                f"{r.drain_waits.share('LWLock:'):.1%}",
                r.drain_waits.top(),
            ]
            for r in rows
        ],
    )
    sustained_waits = report.table(
        ["processes", "active backends", "Lock", "LWLock", "top wait events (sustained)"],
        [
            [
                str(r.processes),
                f"{r.sustained_waits.active():.1f}",
                f"{r.sustained_waits.share('Lock:'):.1%}",
                f"{r.sustained_waits.share('LWLock:'):.1%}",
                r.sustained_waits.top(),
            ]
            for r in rows
        ],
    )
    per_job = report.table(
        ["processes", "round trips per job in the drain (pool reset: asyncpg's, on release)"],
        [[str(r.processes), r.cost.top] for r in rows],
    )
    maint = sorted(idle.statements.items(), key=lambda kv: -kv[1][0])
    idle_rows = [
        [name, "maintenance" if name in MAINTENANCE else "other", f"{c:.2f}", f"{ms:.2f}"]
        for name, (c, ms) in maint
    ]
    m_calls = sum(c for n, (c, _) in maint if n in MAINTENANCE)
    m_ms = sum(ms for n, (_, ms) in maint if n in MAINTENANCE)
    all_calls = sum(c for _, (c, _) in maint)
    idle_table = report.table(["statement", "part", "calls/s", "server ms/s"], idle_rows)
    return "\n".join(
        [
            f"drain: {s.jobs:,} no-op jobs; sustained: {s.seconds:.0f} s window; total queue "
            f"concurrency {s.concurrency}, split between the processes",
            "",
            table,
            "",
            sustained_waits,
            "",
            per_job,
            "",
            f"idle: {processes} workers, retention on, {idle.seconds:.0f} s: "
            f"{all_calls:.1f} statements/s in all, maintenance {m_calls:.2f} statements/s "
            f"({m_ms:.2f} ms of server time per second), {idle.commits:.1f} commits/s",
            "",
            idle_table,
        ]
    )


async def measure(dsn: str, s: Sizes, processes: Sequence[int]) -> str:
    async with asyncpg.create_pool(dsn, min_size=2, max_size=8) as pool:
        await cyclone.Client(pool).migrate()
        await pool.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        rows = []
        for p in processes:
            rate, waits, cost = await drain(pool, dsn, p, s)
            resumed, _, _ = await drain(pool, dsn, p, s, resume=True)
            rate2, waits2 = await sustained(pool, dsn, p, s)
            rows.append(Row(p, rate, resumed, rate2, cost, waits, waits2))
            print(
                f"# {p} processes: drain {rate:,.0f} jobs/s, after a resume {resumed:,.0f}, "
                f"sustained {rate2:,.0f}",
                flush=True,
            )
        idle = await idle_maintenance(pool, dsn, max(processes), s.idle)
        await truncate(pool)
    return render(rows, idle, max(processes), s)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--dsn", default=os.environ.get("CYCLONE_BENCH_DSN"))
    parser.add_argument("--quick", action="store_true", help="smaller sizes")
    parser.add_argument("--processes", default=",".join(map(str, PROCESSES)))
    parser.add_argument("--concurrency", type=int, help="total queue concurrency (default 64)")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a server setting for the throwaway server, e.g. commit_delay=200",
    )
    args = parser.parse_args()
    sizes = QUICK if args.quick else Sizes()
    if args.concurrency:
        sizes = replace(sizes, concurrency=args.concurrency)
    processes = [int(p) for p in args.processes.split(",")]
    if args.dsn:
        print(asyncio.run(measure(args.dsn, sizes, processes)))
        return
    settings = {"shared_preload_libraries": "pg_stat_statements"}
    settings.update(kv.split("=", 1) for kv in args.set)
    with postgres_server(env_var="CYCLONE_BENCH_DSN", durable=True, settings=settings) as server:
        extra = "".join(f", {kv}" for kv in args.set)
        print(f"# {describe(server)}, durable settings{extra}")
        print(asyncio.run(measure(server.dsn, sizes, processes)))


if __name__ == "__main__":
    main()
