"""Run the benchmarks on one PostgreSQL, in one run, and print Cyclone's figures beside the
raw-SQL floors and beside PgQueuer and Procrastinate:
``python -m benchmarks [--quick] [--rounds N] [--only SCENARIO,...] [--dsn DSN]``.

Without ``--dsn`` (or ``CYCLONE_BENCH_DSN``) it starts a throwaway server with PostgreSQL's
durable defaults (fsync and synchronous_commit on), so the numbers mean what they would in
production. Scenarios: insert, enqueue, drain, stale, wake, others, workflows, dynamic.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, replace
from urllib.parse import urlsplit

import asyncpg

import cyclone
from benchmarks import batches, dynamic, embedded, floor, history, library, others, report
from benchmarks.floor import Figure
from benchmarks.jobs import truncate
from benchmarks.report import Results
from cyclone.testing import describe, postgres_server

SCENARIOS = ("insert", "enqueue", "drain", "stale", "wake", "others", "workflows", "dynamic")


@dataclass(frozen=True)
class Sizes:
    """How much each scenario does; ``--quick`` shrinks them."""

    rounds: int = 2  # every measured figure is run this many times, both sides alike
    jobs: int = 10_000  # drained jobs, enqueue_many jobs
    calls: int = 2_000  # sequential single enqueues
    history: int = 1_000_000  # finished runs under the stale-statistics drain
    cap: float = 60.0  # seconds a stale-statistics drain may take before it is cut short
    wake_history: int = 20_000
    workflow_history: int = 100_000  # finished chain3 runs under the workflow figures
    samples: int = 200  # wake latency samples


QUICK = Sizes(
    rounds=1,
    jobs=2_000,
    calls=500,
    history=100_000,
    cap=15.0,
    samples=100,
    workflow_history=10_000,
)

Measure = Callable[[], Awaitable[Figure | tuple[Figure, ...] | list[Figure]]]


class Bench:
    """One run's state: the pool, the sizes and every figure measured so far."""

    def __init__(self, pool: asyncpg.Pool, dsn: str, dsn_for: Callable[[str], str], sizes: Sizes):
        self.pool, self.dsn, self.dsn_for, self.sizes = pool, dsn, dsn_for, sizes
        self.results: Results = {}
        self.notes: list[str] = []

    async def settle(self) -> None:
        """Clean tables and an empty WAL backlog before each measured side."""
        await self.pool.execute("VACUUM ANALYZE", timeout=600)
        await self.pool.execute("CHECKPOINT", timeout=600)

    def keep(self, result: Figure | Sequence[Figure]) -> None:
        for f in [result] if isinstance(result, Figure) else result:
            self.results.setdefault(f.name, []).append(f)

    async def rounds(self, *sides: Measure) -> None:
        """Each side in turn on a settled server, once per round."""
        for _ in range(self.sizes.rounds):
            for side in sides:
                await self.settle()
                self.keep(await side())

    async def insert(self) -> None:
        pool, s = self.pool, self.sizes
        await self.rounds(
            lambda: floor.insert_unnest(pool, s.jobs),
            lambda: floor.insert_runs_tasks(pool, s.jobs),
            lambda: library.enqueue_many(pool, s.jobs),
            lambda: floor.insert_single(pool, s.calls),
            lambda: library.enqueue_single(pool, s.calls),
        )
        await self.settle()
        self.keep(await floor.insert_copy(pool, s.jobs))

    async def connect(self) -> asyncpg.Connection:
        """A connection of its own, outside the pool (for a floor's listener)."""
        conn: asyncpg.Connection = await asyncpg.connect(self.dsn)
        return conn

    async def enqueue(self) -> None:
        pool, s = self.pool, self.sizes
        await self.rounds(
            lambda: floor.insert_notify(pool, s.calls),
            lambda: floor.insert_notify_consumed(pool, self.connect, s.calls),
            lambda: embedded.enqueue_with_worker(pool, s.calls),
        )

    async def drain(self) -> None:
        pool, s = self.pool, self.sizes
        await self.rounds(
            lambda: floor.drain_delete(pool, s.jobs),
            lambda: floor.drain_runs_tasks(pool, s.jobs),
            lambda: embedded.drain(pool, s.jobs, 16),
            lambda: embedded.drain(pool, s.jobs, 16, sync=True),
            lambda: embedded.drain(pool, s.jobs, 200),
            lambda: batches.drain(pool, s.jobs),
            lambda: batches.write_drain(pool, s.jobs, batched=False),
            lambda: batches.write_drain(pool, s.jobs, batched=True),
            lambda: library.drain(pool, self.dsn, s.jobs),
        )
        await self.settle()
        self.keep(await floor.drain_update(pool, s.jobs))

    async def stale(self) -> None:
        pool, s = self.pool, self.sizes
        await truncate(pool)
        start = time.perf_counter()
        await history.build_history(pool, s.history)
        built = time.perf_counter() - start
        await history.autovacuum(pool, enabled=False)
        plans: dict[str, dict[str, str]] = {}

        def side(analyze: bool) -> Measure:
            async def run() -> Figure:
                figure, plan = await embedded.stale_drain(
                    pool, self.dsn, s.jobs, 16, analyze=analyze, cap=s.cap
                )
                plans.setdefault("analyzed" if analyze else "stale", plan)
                return figure

            return run

        try:
            await self.rounds(side(False), side(True))
        finally:
            await history.autovacuum(pool, enabled=True)
            await truncate(pool)
        self.notes.append(
            f"stale drain: {s.history:,} finished runs written in {built:.0f} s, then VACUUM "
            f"ANALYZE, autovacuum off, a burst of {s.jobs:,} enqueues (enqueue_many, "
            f"batches of {embedded.BATCH}) and the drain; the analyzed drain ANALYZEs after "
            "the burst. The claim's plans right before each drain (first round):"
        )
        for state, by_mode in plans.items():
            for mode, plan in by_mode.items():
                verdict = "SCANS cyclone_runs" if history.scans_runs(plan) else "runs by key"
                self.notes.append(f"  - {state}, {mode} plan ({verdict}): {plan}")

    async def wake(self) -> None:
        pool, s = self.pool, self.sizes
        # The history is written once, before the rounds: each side then runs on a settled
        # server, not Cyclone's right after 20,000 fresh rows (and their autovacuum).
        await truncate(pool)
        await history.build_history(pool, s.wake_history)
        try:
            await self.rounds(
                lambda: floor.wake_latency(pool, self.connect, s.samples),
                lambda: library.wake_latency(pool, s.samples),
            )
        finally:
            await truncate(pool)

    async def others(self) -> None:
        if gone := others.missing():
            self.notes.append(
                f"not compared: {', '.join(gone)} not installed; install the bench extra "
                "(pip install -e '.[bench]') or run nox -s bench"
            )
        s = self.sizes
        async with others.libraries(self.pool, self.dsn_for) as found:
            for _ in range(s.rounds):
                for lib in found.values():
                    await self.settle()
                    self.keep(await lib.figures(s.jobs, s.calls))

    async def workflows(self) -> None:
        pool, s = self.pool, self.sizes
        # Over a history of finished workflow runs (steps and edges), which node transitions
        # must read by key, as the claims read runs.
        await truncate(pool)
        await history.build_history(pool, s.workflow_history, library.chain3)
        try:
            await self.settle()
            self.keep(await library.workflow_runs(pool, self.dsn, library.chain3, runs=300))
            self.keep(await library.workflow_runs(pool, self.dsn, library.fanout, runs=20))
        finally:
            await truncate(pool)
        self.notes.append(
            f"chain3 and fanout: over {s.workflow_history:,} finished chain3 runs "
            f"({3 * s.workflow_history:,} steps, {2 * s.workflow_history:,} edges)"
        )
        self.keep(await library.submit_rates(pool))

    async def dynamic(self) -> None:
        pool, s = self.pool, self.sizes
        # Over the same history as the workflow figures: the map's growth and its items'
        # completions must read steps by key.
        await truncate(pool)
        await history.build_history(pool, s.workflow_history, library.chain3)
        try:
            await self.rounds(
                lambda: dynamic.map_drain(pool),
                lambda: dynamic.children_drain(pool),
                lambda: dynamic.job_drain(pool),
            )
            await self.settle()
            plan = await dynamic.expansion_plan(pool)
            await self.settle()
            bound = await dynamic.expansion_plan(pool, items=cyclone.MAX_ITEMS)
        finally:
            await truncate(pool)
        best = {name: max(self.results[name], key=lambda f: f.value) for name in dynamic.NAMES}
        self.notes.extend(dynamic.ratio_notes(best))
        self.notes.append(
            f"map nodes, child nodes and their job drain: over {s.workflow_history:,} "
            "finished chain3 runs; map_expand over 1,000 items, one statement (EXPLAIN ANALYZE):"
        )
        self.notes.extend(f"  {line}" for line in plan.splitlines())
        took = [line.strip() for line in bound.splitlines() if "Execution Time" in line]
        self.notes.append(f"map_expand over {cyclone.MAX_ITEMS:,} items (the bound): {took[0]}")


async def settings(pool: asyncpg.Pool) -> str:
    """The machine and the server settings that the figures depend on."""
    names = ("fsync", "synchronous_commit", "full_page_writes", "shared_buffers", "max_connections")
    values = [f"{n}={await pool.fetchval(f'SHOW {n}')}" for n in names]
    version = await pool.fetchval("SHOW server_version")
    return (
        f"{os.cpu_count()} cores ({platform.machine()}, {platform.system()}), "
        f"Python {platform.python_version()}, PostgreSQL {version}: {', '.join(values)}"
    )


async def measure(
    dsn: str, dsn_for: Callable[[str], str], sizes: Sizes, only: Sequence[str]
) -> str:
    async with asyncpg.create_pool(dsn, min_size=2, max_size=20) as pool:
        await cyclone.Client(pool).migrate()
        bench = Bench(pool, dsn, dsn_for, sizes)
        header = await settings(pool)
        start = time.perf_counter()
        for name in only:
            step = time.perf_counter()
            await getattr(bench, name)()
            print(f"# {name}: {time.perf_counter() - step:.0f} s", file=sys.stderr)
        elapsed = time.perf_counter() - start
    names = [n for n in others.LIBRARIES if any(k.startswith(n + " ") for k in bench.results)]
    lines = [
        f"# {header}",
        f"# {sizes.rounds} round(s), {sizes.jobs:,} jobs, {sizes.calls:,} calls; "
        f"best round shown, (min-max) over rounds; took {elapsed:.0f} s",
        "",
        report.floors(bench.results),
    ]
    if "others" in only:
        lines += ["", report.others(bench.results, names)]
    extras = report.extras(bench.results)
    if extras or bench.notes:
        lines += ["", *extras, *(f"- {n}" if not n.startswith("  ") else n for n in bench.notes)]
    return "\n".join(lines)


def _dsn_for(dsn: str) -> Callable[[str], str]:
    return lambda database: urlsplit(dsn)._replace(path="/" + database).geturl()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--dsn", default=os.environ.get("CYCLONE_BENCH_DSN"))
    parser.add_argument("--quick", action="store_true", help="smaller sizes, one round")
    parser.add_argument("--rounds", type=int, help="rounds per figure (default 2, quick 1)")
    parser.add_argument("--only", help=f"comma-separated scenarios of: {', '.join(SCENARIOS)}")
    args = parser.parse_args()
    sizes = QUICK if args.quick else Sizes()
    if args.rounds:
        sizes = replace(sizes, rounds=args.rounds)
    only = args.only.split(",") if args.only else list(SCENARIOS)
    if unknown := [name for name in only if name not in SCENARIOS]:
        parser.error(f"unknown scenario {', '.join(unknown)}; choose from {', '.join(SCENARIOS)}")
    if args.dsn:
        print(asyncio.run(measure(args.dsn, _dsn_for(args.dsn), sizes, only)))
        return
    with postgres_server(env_var="CYCLONE_BENCH_DSN", durable=True) as server:
        print(f"# {describe(server)}, durable settings")
        print(asyncio.run(measure(server.dsn, server.dsn_for, sizes, only)))


if __name__ == "__main__":
    main()
