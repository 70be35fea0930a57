"""A steady mixed load for a long time: ``python -m benchmarks.soak --minutes N [--plot PNG]``.

One process holds a producer and an embedded worker. Every tenth of a second the producer
enqueues standalone jobs (``enqueue_many``), submits 3-node chains, submits chains once by a
new key and repeats a recent key (which must give back the same run). Every attempt fails
with probability 5 % (decided by its run, node and attempt, so the outcome of every run is
known in advance); a job or node has 3 attempts, retried after 0.2 s. The client's
``retention`` sweeper deletes finished runs older than ``--retention`` seconds.

Every ``--every`` seconds (default 60, or 10 in runs under 10 minutes) it records: runs
finished per second, p50/p99 latency from submit to the last handler's end, each table's
heap and index size, dead tuples, autovacuum runs and runs purged. At the end it drains,
checks the ledger (every run has the outcome its planned failures give it, nothing lost,
every repeat got its run back), prints the series and, with ``--plot``, draws them.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import logging
import os
import random
import statistics
import time
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field

import asyncpg
import msgspec

import cyclone
from benchmarks import report
from benchmarks.jobs import truncate
from cyclone.testing import describe, postgres_server

QUEUE = "soak"
TABLES = ("cyclone_runs", "cyclone_steps", "cyclone_edges", "cyclone_tasks")
ATTEMPTS = 3
FAIL_PERCENT = 5
TICK = 0.1
_SIZES = """
SELECT s.relname AS name, pg_table_size(s.relid) AS heap, pg_indexes_size(s.relid) AS indexes,
    s.n_dead_tup AS dead, s.autovacuum_count AS autovacuums, s.n_tup_del AS deleted
FROM pg_stat_user_tables s WHERE s.relname = ANY ($1::text[])
"""


class Item(msgspec.Struct, frozen=True):
    """A soak run's input: its ledger number and when it was submitted."""

    i: int
    t0: float


def planned_failure(i: int, node: str, attempt: int) -> bool:
    """Whether attempt ``attempt`` of run ``i``'s node fails (about 5 %)."""
    return zlib.crc32(f"{i}/{node}/{attempt}".encode()) % 100 < FAIL_PERCENT


def fails_for_good(i: int, nodes: Sequence[str]) -> bool:
    """Whether run ``i`` fails: one of its nodes fails every attempt."""
    return any(all(planned_failure(i, n, a) for a in range(1, ATTEMPTS + 1)) for n in nodes)


@dataclass
class Ledger:
    """What was submitted and what the handlers saw end."""

    nodes: dict[int, tuple[str, ...]] = field(default_factory=dict)  # run -> its nodes
    done: set[int] = field(default_factory=set)
    failed: set[int] = field(default_factory=set)
    latencies: list[float] = field(default_factory=list)  # since the last sample, ms
    finished: int = 0  # since the last sample
    repeats: int = 0
    wrong_repeats: int = 0
    first_purge: float | None = None  # seconds into the run of the first sample after one

    def outcome(self, item: Item, node: str, attempt: int, last: bool) -> None:
        """Called by the handler; raises the planned failures."""
        if planned_failure(item.i, node, attempt):
            if attempt >= ATTEMPTS:
                self.failed.add(item.i)
                self.finished += 1
            raise RuntimeError(f"soak: planned failure of run {item.i} node {node!r}")
        if last:
            self.done.add(item.i)
            self.finished += 1
            self.latencies.append((time.perf_counter() - item.t0) * 1000)

    def lost(self) -> list[int]:
        return sorted(set(self.nodes) - self.done - self.failed)

    def wrong(self) -> list[int]:
        """Runs whose outcome is not the planned one."""
        return sorted(
            i
            for i, nodes in self.nodes.items()
            if (i in self.done and fails_for_good(i, nodes))
            or (i in self.failed and not fails_for_good(i, nodes))
        )


ledger = Ledger()
JOB_NODES = ("",)
CHAIN_NODES = ("a", "b", "c")


@cyclone.action("soak.job", queue=QUEUE, max_attempts=ATTEMPTS)
async def job(ctx: cyclone.Context, item: Item) -> None:
    ledger.outcome(item, "", ctx.attempt, True)


@cyclone.action("soak.node", queue=QUEUE, max_attempts=ATTEMPTS)
async def node(ctx: cyclone.Context, item: Item) -> None:
    ledger.outcome(item, ctx.node or "", ctx.attempt, ctx.node == "c")


chain = cyclone.define("soak.chain", Item)
_a = chain.node(node, name="a")
_b = chain.node(node, name="b", after=[_a])
chain.node(node, name="c", after=[_b])


@dataclass(frozen=True)
class Sample:
    """One point of the series."""

    t: float  # seconds into the run
    rate: float  # runs finished per second since the previous sample
    p50: float
    p99: float
    heap: dict[str, int]  # bytes per table
    indexes: dict[str, int]
    dead: dict[str, int]
    autovacuums: int  # on Cyclone's tables, since the start
    purged: int  # since the start

    def total(self) -> int:
        return sum(self.heap.values()) + sum(self.indexes.values())


@dataclass(frozen=True)
class Soak:
    """A soak run's series and its ledger's verdict."""

    samples: list[Sample]
    submitted: int
    lost: list[int]
    wrong: list[int]
    repeats: int
    wrong_repeats: int
    first_purge: float | None
    retention: float
    pending_left: int

    def growth(self) -> float:
        """Total size at its largest over the second half of the steady state (from one
        retention period after the first purge) over the first half's largest."""
        if self.first_purge is None:
            return float("inf")
        steady = [s for s in self.samples if s.t >= self.first_purge + self.retention]
        if len(steady) < 4:
            return float("nan")
        half = len(steady) // 2
        return max(s.total() for s in steady[half:]) / max(s.total() for s in steady[:half])


async def _produce(client: cyclone.Client, rate: float, until: float) -> int:
    """Submit about ``rate`` runs a second until ``until``; how many runs were made."""
    n = 0
    recent: list[tuple[str, Item, object]] = []  # submit_once keys of the last few seconds
    per_tick = rate * TICK
    jobs_per_tick = max(1, round(per_tick * 0.6))
    budget = 0.0
    while (now := time.perf_counter()) < until:
        items = [Item(n + k, now) for k in range(jobs_per_tick)]
        for it in items:
            ledger.nodes[it.i] = JOB_NODES
        await job.enqueue_many(client, items)
        n += len(items)
        budget += per_tick * 0.4  # chains: half plain, half once by key
        while budget >= 1:
            budget -= 1
            item = Item(n, time.perf_counter())
            ledger.nodes[n] = CHAIN_NODES
            n += 1
            if n % 2:
                await chain.submit(client, item)
            else:
                run, _ = await chain.submit_once(client, f"k{item.i}", item)
                recent.append((f"k{item.i}", item, run.id))
        if recent:
            key, item, run_id = random.choice(recent[-50:])
            again, created = await chain.submit_once(client, key, item)
            ledger.repeats += 1
            if created or again.id != run_id:
                ledger.wrong_repeats += 1
        recent = recent[-200:]
        await asyncio.sleep(max(0.0, TICK - (time.perf_counter() - now)))
    return n


async def _sample(pool: asyncpg.Pool, start: float, last: float) -> Sample:
    rows = {r["name"]: r for r in await pool.fetch(_SIZES, list(TABLES))}
    lat = sorted(ledger.latencies)
    cuts = statistics.quantiles(lat, n=100) if len(lat) >= 2 else [float("nan")] * 99
    now = time.perf_counter()
    sample = Sample(
        t=now - start,
        rate=ledger.finished / (now - last),
        p50=cuts[49],
        p99=cuts[98],
        heap={t: rows[t]["heap"] for t in TABLES},
        indexes={t: rows[t]["indexes"] for t in TABLES},
        dead={t: rows[t]["dead"] for t in TABLES},
        autovacuums=sum(rows[t]["autovacuums"] for t in TABLES),
        purged=rows["cyclone_runs"]["deleted"],  # only the sweeper deletes runs
    )
    if sample.purged and ledger.first_purge is None:
        ledger.first_purge = sample.t
    ledger.latencies.clear()
    ledger.finished = 0
    return sample


async def _drained(pool: asyncpg.Pool, timeout: float) -> None:
    deadline = time.perf_counter() + timeout
    while await pool.fetchval("SELECT count(*) FROM cyclone_tasks"):
        if time.perf_counter() > deadline:
            raise RuntimeError("the soak's work was not done in time after the load stopped")
        await asyncio.sleep(0.2)


async def soak(
    dsn: str, *, seconds: float, every: float, rate: float, retention: float, concurrency: int = 32
) -> Soak:
    """Run the soak on ``dsn`` (Cyclone's tables are emptied first) and return its series."""
    global ledger
    ledger = Ledger()
    keep = dt.timedelta(seconds=retention)
    async with asyncpg.create_pool(dsn, min_size=4, max_size=24) as pool:
        await cyclone.Client(pool).migrate()
        await truncate(pool)
        await pool.execute("SELECT pg_stat_reset()")
        retain = cyclone.Retention(completed=keep, failed=keep, cancelled=keep)
        client = cyclone.Client(pool, retention=retain)
        worker = cyclone.Worker(
            client,
            steps=[job],
            workflows=[chain],
            queues={QUEUE: concurrency},
            backoff=lambda attempt: 0.2,
        )
        samples: list[Sample] = []
        async with worker:
            start = time.perf_counter()
            producer = asyncio.create_task(_produce(client, rate, start + seconds))
            last = start
            while not producer.done():
                await asyncio.wait({producer}, timeout=last + every - time.perf_counter())
                if time.perf_counter() >= last + every or producer.done():
                    samples.append(await _sample(pool, start, last))
                    last = time.perf_counter()
            submitted = await producer
            await _drained(pool, 300)
            await worker.drain()
        pending = await pool.fetchval("SELECT count(*) FROM cyclone_runs WHERE state = 'pending'")
        await client.aclose()
    return Soak(
        samples,
        submitted,
        ledger.lost(),
        ledger.wrong(),
        ledger.repeats,
        ledger.wrong_repeats,
        ledger.first_purge,
        retention,
        pending,
    )


def _mb(n: int) -> str:
    return f"{n / 2**20:.1f}"


def render(result: Soak) -> str:
    """The series as a Markdown table, and the ledger's verdict."""
    rows = [
        [
            f"{s.t / 60:.1f}",
            f"{s.rate:,.0f}",
            f"{s.p50:.0f}",
            f"{s.p99:.0f}",
            *(f"{_mb(s.heap[t])} + {_mb(s.indexes[t])}" for t in TABLES),
            f"{sum(s.dead.values()):,}",
            str(s.autovacuums),
            f"{s.purged:,}",
        ]
        for s in result.samples
    ]
    header = ["min", "runs/s", "p50 ms", "p99 ms"]
    header += [f"{t.removeprefix('cyclone_')} MB (heap + idx)" for t in TABLES]
    header += ["dead tuples", "autovacuums", "purged"]
    first = f"{result.first_purge:.0f} s" if result.first_purge is not None else "never"
    verdict = [
        f"submitted {result.submitted:,} runs; lost {len(result.lost)}, wrong outcome "
        f"{len(result.wrong)}, pending after the drain {result.pending_left}; "
        f"{result.repeats:,} submit_once repeats, {result.wrong_repeats} not given their run",
        f"first retention purge at {first} (retention {result.retention:.0f} s); total size "
        f"growth over the steady state {result.growth():.2f}",
    ]
    return "\n".join([report.table(header, rows), "", *verdict])


def plot(result: Soak, path: str) -> None:
    """Throughput, latency, sizes and dead tuples against time, in one PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    minutes = [s.t / 60 for s in result.samples]
    fig, axes = plt.subplots(2, 2, figsize=(11, 7), sharex=True)
    (rate, lat), (size, dead) = axes
    rate.plot(minutes, [s.rate for s in result.samples])
    rate.set_title("runs finished per second")
    lat.plot(minutes, [s.p50 for s in result.samples], label="p50")
    lat.plot(minutes, [s.p99 for s in result.samples], label="p99")
    lat.set_title("submit to last handler end, ms")
    lat.legend()
    for t in TABLES:
        size.plot(minutes, [(s.heap[t] + s.indexes[t]) / 2**20 for s in result.samples], label=t)
    size.set_title("table + index size, MB")
    size.legend(fontsize="small")
    dead.plot(minutes, [sum(s.dead.values()) for s in result.samples], label="dead tuples")
    dead.set_title("dead tuples (Cyclone's tables)")
    runs = dead.twinx()
    runs.plot(minutes, [s.autovacuums for s in result.samples], color="tab:red")
    runs.set_ylabel("autovacuum runs", color="tab:red")
    for ax in (size, dead):
        ax.set_xlabel("minutes")
    fig.suptitle(
        f"soak: {result.submitted:,} runs, retention {result.retention:.0f} s, "
        f"lost {len(result.lost)}"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=80)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--dsn", default=os.environ.get("CYCLONE_BENCH_DSN"))
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--every", type=float, help="seconds between samples")
    parser.add_argument("--rate", type=float, default=100.0, help="runs submitted per second")
    parser.add_argument("--retention", type=float, default=60.0, help="seconds runs are kept")
    parser.add_argument("--plot", help="write the series as a PNG here")
    args = parser.parse_args()
    every = args.every or (60.0 if args.minutes >= 10 else 10.0)
    logging.basicConfig(level=logging.ERROR)  # not the warning of every planned failure

    def run(dsn: str) -> None:
        result = asyncio.run(
            soak(
                dsn,
                seconds=args.minutes * 60,
                every=every,
                rate=args.rate,
                retention=args.retention,
            )
        )
        print(render(result))
        if args.plot:
            plot(result, args.plot)

    if args.dsn:
        run(args.dsn)
        return
    with postgres_server(env_var="CYCLONE_BENCH_DSN", durable=True) as server:
        print(f"# {describe(server)}, durable settings")
        run(server.dsn)


if __name__ == "__main__":
    main()
