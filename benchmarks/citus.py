"""Cyclone on a Citus coordinator beside one PostgreSQL server:
``python -m benchmarks.citus [--quick] [--rounds N]``.

In one run, with the same durable settings (fsync and synchronous_commit on), it starts a
plain server and a Citus cluster (a coordinator and two worker nodes), all on this machine,
and measures the same work on each, the two sides of every figure back to back on settled
servers (VACUUM ANALYZE, then a CHECKPOINT on every node), the side that goes first
alternating by round:

- ``enqueue_many`` in batches of 1,000, and sequential ``enqueue`` calls while a worker in
  this process runs them;
- a drain of a prefilled queue by a worker in this process at queue concurrency 16;
- sequential ``submit`` and ``submit_once`` of a three-node chain workflow;
- a transaction that inserts the application's orders and enqueues a job: on the plain
  server one table; on Citus a table distributed by tenant, written for one tenant (one
  worker node) or for two tenants whose shards are on different worker nodes. On Citus,
  Cyclone marks its caller transactions so that they commit in two phases either way;
- the first ``enqueue`` on a new connection: asyncpg's type introspection is part of it;
- over a history of finished runs (1,000,000 by default) with autovacuum off: a burst of
  enqueues drained on the statistics from before it (the claim's plan as a worker meets it
  after a burst), and the order transactions again.

Before the measured rounds, every figure runs once at small sizes on both sides, unmeasured,
so that the pools' connections have their statements prepared and their types introspected.
Cyclone's tables are local to the coordinator. The ratio is Citus's figure over the plain
server's, of the best rounds, with the range of the per-round ratios.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import os
import platform
import statistics
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass

import asyncpg

import cyclone
from benchmarks import embedded, history, library, report
from benchmarks.floor import Figure
from benchmarks.jobs import noop, truncate
from benchmarks.report import Results
from cyclone.testing import postgres_server
from cyclone.testing._citus import citus_cluster, dsn_for, execute, form_database

DATABASE = "bench_citus"
ORDERS = (
    "CREATE TABLE orders (tenant int NOT NULL, id bigint NOT NULL, total int NOT NULL,"
    " PRIMARY KEY (tenant, id))"
)
DISTRIBUTE = "SELECT create_distributed_table('orders', 'tenant')"
# Each of 64 tenants with the port of the worker node that holds its shard.
_PLACEMENTS = """
SELECT t, (SELECT nodeport FROM citus_shards s
           WHERE s.shardid = get_shard_id_for_distribution_column('orders', t)) AS port
FROM generate_series(1, 64) t ORDER BY t
"""
# Both sides run with this many connections allowed (a Citus cluster's nodes run with 300).
MAX_CONNECTIONS = "300"
_SHOWN = ("fsync", "synchronous_commit", "full_page_writes", "shared_buffers", "max_connections")

Measure = Callable[["Side"], Awaitable[Figure | Sequence[Figure]]]


@dataclass(frozen=True)
class Sizes:
    rounds: int = 4
    jobs: int = 10_000  # enqueue_many jobs, drained jobs
    calls: int = 1_000  # sequential enqueues, order transactions, workflow submits
    fresh: int = 5  # new connections whose first enqueue is timed
    history: int = 1_000_000  # finished runs under the stale drain and the order transactions
    cap: float = 60.0  # seconds a stale drain may take before it is cut short


QUICK = Sizes(rounds=1, jobs=2_000, calls=200, fresh=3, history=20_000, cap=15.0)
WARM = Sizes(rounds=1, jobs=2_000, calls=100, fresh=1)


@dataclass
class Side:
    """One database under test: its pool, its DSN, and the DSNs of every node to settle."""

    name: str
    pool: asyncpg.Pool
    dsn: str
    nodes: tuple[str, ...]
    tenants: tuple[int, int]  # two tenants; on Citus, on different worker nodes

    async def settle(self) -> None:
        """Clean tables and an empty WAL backlog on every node before a measured side."""
        await self.pool.execute("VACUUM ANALYZE", timeout=600)
        await self.pool.execute("VACUUM ANALYZE orders", timeout=600)  # on Citus: its shards
        for node in self.nodes:
            await execute(node, "CHECKPOINT")


async def tenants(pool: asyncpg.Pool, citus: bool) -> tuple[int, int]:
    """Two tenants whose shards are on different worker nodes (any two on one server)."""
    if not citus:
        return 1, 2
    rows = await pool.fetch(_PLACEMENTS)
    other = next(r["t"] for r in rows if r["port"] != rows[0]["port"])
    return rows[0]["t"], other


async def enqueue_with_orders(side: Side, n: int, spread: Sequence[int], label: str) -> Figure:
    """``n`` transactions, each inserting one order per tenant of ``spread`` and enqueueing a
    job with ``enqueue_tx``; transactions/s. The jobs are deleted afterwards, and the
    finished runs of a history kept."""
    pool = side.pool
    client = cyclone.Client(pool)
    start = time.perf_counter()
    for i in range(n):
        async with pool.acquire() as conn, client.transaction(conn) as tx:
            for tenant in spread:
                await tx.execute("INSERT INTO orders VALUES ($1, $2, 10)", tenant, i)
            await noop.enqueue_tx(client, tx, i)
    elapsed = time.perf_counter() - start
    orders = await pool.fetchval("SELECT count(*) FROM orders")
    if orders != n * len(spread):
        raise RuntimeError(f"{label}: {orders} orders written, {n * len(spread)} expected")
    await pool.execute("TRUNCATE orders")
    await pool.execute("DELETE FROM cyclone_tasks")
    await pool.execute("DELETE FROM cyclone_runs WHERE state = 'pending'")
    return Figure(label, n / elapsed, "tx/s", f"n={n}")


async def first_enqueue(side: Side, n: int) -> Figure:
    """A client on a new connection (a pool of one), its first ``enqueue``; ms, the median of
    ``n`` connections. It prepares the statement, and asyncpg asks the server for the types
    of its parameters and columns (the introspection query), once per connection."""
    took = []
    for i in range(n):
        async with asyncpg.create_pool(side.dsn, min_size=1, max_size=1) as pool:
            client = cyclone.Client(pool)
            start = time.perf_counter()
            await noop.enqueue(client, i)
            took.append((time.perf_counter() - start) * 1000)
            await client.aclose()
    await truncate(side.pool)
    return Figure("first enqueue", statistics.median(took), "ms", f"median of {n} connections")


def measures(sizes: Sizes) -> list[Measure]:
    s = sizes
    return [
        lambda side: library.enqueue_many(side.pool, s.jobs),
        lambda side: embedded.enqueue_with_worker(side.pool, s.calls),
        lambda side: embedded.drain(side.pool, s.jobs, 16),
        lambda side: library.submit_rates(side.pool, s.calls),
        lambda side: enqueue_with_orders(side, s.calls, side.tenants[:1], "enqueue + 1 order"),
        lambda side: enqueue_with_orders(side, s.calls, side.tenants, "enqueue + 2 orders"),
        lambda side: first_enqueue(side, s.fresh),
    ]


def over_history(sizes: Sizes) -> list[Measure]:
    s = sizes

    async def stale(side: Side) -> Figure:
        figure, _ = await embedded.stale_drain(
            side.pool, side.dsn, s.jobs, 16, analyze=False, cap=s.cap
        )
        return figure

    return [
        stale,
        lambda side: enqueue_with_orders(
            side, s.calls, side.tenants[:1], "enqueue + 1 order, history"
        ),
    ]


async def run(sides: tuple[Side, Side], sizes: Sizes) -> tuple[Results, Results]:
    """Every figure on both sides, back to back, for each round; the side that goes first
    alternates by round. Then, on a history of finished runs built on both, the figures over
    it likewise."""
    for measure in measures(WARM):
        for side in sides:
            await side.settle()
            await measure(side)
    results: tuple[Results, Results] = ({}, {})
    await rounds(sides, measures(sizes), sizes.rounds, results)
    for side in sides:
        await truncate(side.pool)
        await history.build_history(side.pool, sizes.history)
        await history.autovacuum(side.pool, enabled=False)
    try:
        await rounds(sides, over_history(sizes), sizes.rounds, results)
    finally:
        for side in sides:
            await history.autovacuum(side.pool, enabled=True)
            await truncate(side.pool)
    return results


async def rounds(
    sides: tuple[Side, Side], measured: list[Measure], count: int, results: tuple[Results, Results]
) -> None:
    """``count`` rounds of the ``measured`` figures into ``results``, both sides back to back."""
    for number in range(count):
        order = (0, 1) if number % 2 == 0 else (1, 0)
        for measure in measured:
            for index in order:
                side = sides[index]
                await side.settle()
                step = time.perf_counter()
                got = await measure(side)
                for figure in [got] if isinstance(got, Figure) else got:
                    results[index].setdefault(figure.name, []).append(figure)
                    print(
                        f"# round {number + 1}, {side.name}: {figure.name} "
                        f"{figure.value:,.2f} {figure.unit} ({time.perf_counter() - step:.0f} s)",
                        file=sys.stderr,
                    )


def table(plain: Results, citus: Results) -> str:
    rows = [
        [
            f"{name}, {figures[0].unit}",
            report.value(figures),
            report.value(citus[name]),
            report.ratio_of(citus[name], figures)[0],
        ]
        for name, figures in plain.items()
    ]
    return report.table(["figure", "one server", "Citus (3 nodes)", "ratio"], rows)


async def prepare(dsn: str, citus: bool) -> None:
    """Migrate Cyclone and make the orders table (distributed by tenant on Citus)."""
    async with asyncpg.create_pool(dsn, min_size=1, max_size=2) as pool:
        await cyclone.Client(pool).migrate()
        await pool.execute(ORDERS)
        if citus:
            await pool.execute(DISTRIBUTE)


async def settings(pool: asyncpg.Pool) -> str:
    """The server's version and the settings the figures depend on."""
    values = [f"{n}={await pool.fetchval(f'SHOW {n}')}" for n in _SHOWN]
    version = await pool.fetchval("SHOW server_version")
    citus = await pool.fetchval("SELECT extversion FROM pg_extension WHERE extname = 'citus'")
    product = f"PostgreSQL {version}" + (f", Citus {citus}" if citus else "")
    return f"{product}: {', '.join(values)}"


@contextlib.asynccontextmanager
async def side(name: str, dsn: str, nodes: tuple[str, ...], citus: bool) -> AsyncIterator[Side]:
    async with asyncpg.create_pool(dsn, min_size=4, max_size=20) as pool:
        yield Side(name, pool, dsn, nodes, await tenants(pool, citus))


async def measure(plain: str, coordinator: str, workers: Sequence[str], sizes: Sizes) -> str:
    """Both sides' figures as a table, with a header saying where and how they ran."""
    nodes = (coordinator, *workers)
    await execute(plain, f"CREATE DATABASE {DATABASE}")
    await form_database(coordinator, workers, DATABASE)
    await prepare(dsn_for(plain, DATABASE), citus=False)
    await prepare(dsn_for(coordinator, DATABASE), citus=True)
    async with (
        side("one server", dsn_for(plain, DATABASE), (plain,), False) as one,
        side("Citus", dsn_for(coordinator, DATABASE), nodes, True) as cluster,
    ):
        header = [
            f"# {os.cpu_count()} cores ({platform.machine()}, {platform.system()}), "
            f"Python {platform.python_version()}",
            f"# one server: {await settings(one.pool)}",
            f"# Citus coordinator + {len(workers)} worker nodes: {await settings(cluster.pool)}",
            f"# tenants {cluster.tenants[0]} and {cluster.tenants[1]} on different worker nodes",
        ]
        start = time.perf_counter()
        alone, spread = await run((one, cluster), sizes)
        elapsed = time.perf_counter() - start
    header.append(
        f"# {sizes.rounds} round(s), {sizes.jobs:,} jobs, {sizes.calls:,} calls, "
        f"{sizes.fresh} new connections, then {sizes.history:,} finished runs, autovacuum "
        f"off; best round shown, (min-max) over rounds; took {elapsed:.0f} s"
    )
    return "\n".join([*header, "", table(alone, spread)])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller sizes, one round")
    parser.add_argument("--rounds", type=int, help="rounds per figure (default 4, quick 1)")
    args = parser.parse_args()
    sizes = QUICK if args.quick else Sizes()
    if args.rounds:
        sizes = dataclasses.replace(sizes, rounds=args.rounds)
    # With CYCLONE_BENCH_DSN set, the plain side is that server: the header shows its settings.
    with (
        postgres_server(
            env_var="CYCLONE_BENCH_DSN",
            durable=True,
            settings={"max_connections": MAX_CONNECTIONS},
        ) as server,
        citus_cluster(durable=True) as cluster,
    ):
        workers = [w.dsn for w in cluster.workers]
        print(asyncio.run(measure(server.dsn, cluster.coordinator.dsn, workers, sizes)))


if __name__ == "__main__":
    main()
