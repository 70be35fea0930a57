"""Cyclone's side of the benchmarks: the same work as each floor in ``floor.py``, through the
library. Each function takes a pool on a scratch database where Cyclone is migrated, and
leaves Cyclone's tables empty when it is done.
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import sys
import time
from pathlib import Path

import asyncpg

import cyclone
from benchmarks.floor import Figure
from benchmarks.jobs import QUEUE, noop, truncate

ROOT = Path(__file__).resolve().parents[1]


async def enqueue_many(pool: asyncpg.Pool, n: int = 10_000, batch: int = 1_000) -> Figure:
    """``enqueue_many`` in batches of ``batch``; jobs/s."""
    client = cyclone.Client(pool)
    await truncate(pool)
    start = time.perf_counter()
    for lo in range(0, n, batch):
        await noop.enqueue_many(client, list(range(lo, min(n, lo + batch))))
    elapsed = time.perf_counter() - start
    await truncate(pool)
    return Figure("enqueue_many", n / elapsed, "jobs/s", f"n={n} batch={batch}")


async def enqueue_single(pool: asyncpg.Pool, n: int = 2_000) -> Figure:
    """Sequential ``enqueue`` calls, each its own transaction (and wakeup); calls/s."""
    client = cyclone.Client(pool)
    await truncate(pool)
    start = time.perf_counter()
    for i in range(n):
        await noop.enqueue(client, i)
    elapsed = time.perf_counter() - start
    await truncate(pool)
    return Figure("enqueue", n / elapsed, "calls/s", f"n={n}, own transaction + NOTIFY each")


async def drain(pool: asyncpg.Pool, dsn: str, n: int = 10_000, concurrency: int = 200) -> Figure:
    """10,000 no-op jobs drained by one worker process; jobs/s from its start to empty."""
    client = cyclone.Client(pool)
    await truncate(pool)
    for lo in range(0, n, 1_000):
        await noop.enqueue_many(client, list(range(lo, min(n, lo + 1_000))))
    await pool.execute("VACUUM ANALYZE")
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "benchmarks.drain_worker",
        dsn,
        str(n),
        str(concurrency),
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=asyncio.subprocess.PIPE,
    )
    out, _ = await proc.communicate()
    if proc.returncode != 0:
        raise RuntimeError(f"drain worker failed with {proc.returncode}")
    result = json.loads(out.decode().strip().splitlines()[-1])
    await truncate(pool)
    return Figure(
        "drain",
        n / result["seconds"],
        "jobs/s",
        f"n={n}, 1 worker process, queue concurrency {concurrency}",
    )


async def wake_latency(
    pool: asyncpg.Pool, samples: int = 200, warmup: int = 10
) -> tuple[Figure, Figure]:
    """Commit of a tracked enqueue to its handler starting in a listening worker; p50/p99 ms.

    The clock starts just before COMMIT, as in the floor; publishing the wakeup after the
    commit is part of what is measured. The run history is the caller's (see
    ``Bench.wake``): it is left as found, but for the runs this adds.
    """
    client = cyclone.Client(pool)
    started: asyncio.Queue[float] = asyncio.Queue()

    @cyclone.step("bench.wake", queue="wake")
    async def wake(ctx: cyclone.Context, i: int) -> None:
        started.put_nowait(time.perf_counter())

    latencies = []
    worker = cyclone.Worker(client, steps=[wake], queues={"wake": 4}, poll_interval=10.0)
    async with worker:
        assert client.services.notifier is not None
        await asyncio.wait_for(client.services.notifier.connected.wait(), 30)
        for i in range(samples + warmup):
            # As the docs show it: commit, publish, then give the connection back.
            async with pool.acquire() as conn, client.transaction(conn) as tx:
                await wake.enqueue_tx(client, tx, i)
                t0 = time.perf_counter()  # COMMIT, then the NOTIFY, run as the block exits
            t1 = await asyncio.wait_for(started.get(), 30)
            if i >= warmup:
                latencies.append((t1 - t0) * 1000)
            await worker.idle()
    cuts = statistics.quantiles(latencies, n=100)
    return (
        Figure("wake p50", cuts[49], "ms", f"{samples} samples"),
        Figure("wake p99", cuts[98], "ms", f"{samples} samples"),
    )


chain3 = cyclone.define("bench.chain3", int)
_a = chain3.node(noop, name="a")
_b = chain3.node(noop, name="b", after=[_a])
chain3.node(noop, name="c", after=[_b])

fanout = cyclone.define("bench.fanout", int)
_root = fanout.node(noop, name="root")
for _i in range(100):
    fanout.node(noop, name=f"leaf{_i}", after=[_root])


async def workflow_runs(
    pool: asyncpg.Pool, dsn: str, workflow: cyclone.Workflow[int], runs: int
) -> tuple[Figure, Figure]:
    """Submit ``runs`` runs, drain them with one in-process worker; runs/s and the worker's
    statements (round trips) per node, every statement counted: claims, completions,
    heartbeats, maintenance and wakeups. The run history is the caller's (see
    ``Bench.workflows``): it is left as found, but for the runs this adds."""
    client = cyclone.Client(pool)
    statements = 0

    def count(_record: object) -> None:
        nonlocal statements
        statements += 1

    async def setup(conn: asyncpg.pool.PoolConnectionProxy) -> None:
        # On every acquire: releasing a connection to the pool drops its query loggers.
        conn.add_query_logger(count)

    async with asyncpg.create_pool(dsn, min_size=4, max_size=8, setup=setup) as worker_pool:
        worker_client = cyclone.Client(worker_pool)
        handles = [await workflow.submit(client, i) for i in range(runs)]
        statements = 0
        start = time.perf_counter()
        async with cyclone.Worker(
            worker_client, workflows=[workflow], queues={QUEUE: 200}, poll_interval=0.05
        ):
            for run in handles:  # a failed run must not count as throughput
                if await run.wait(timeout=600) is not cyclone.RunState.COMPLETED:
                    raise RuntimeError(f"benchmark run {run.id} did not complete")
        elapsed = time.perf_counter() - start
        await worker_client.aclose()
    nodes = runs * len(workflow.nodes)
    name = workflow.name.removeprefix("bench.")
    return (
        Figure(
            f"{name} runs", runs / elapsed, "runs/s", f"{runs} runs of {len(workflow.nodes)} nodes"
        ),
        Figure(f"{name} trips", statements / nodes, "statements/node", "worker side"),
    )


async def submit_rates(pool: asyncpg.Pool, n: int = 1_000) -> list[Figure]:
    """Sequential ``submit`` vs ``submit_once`` with new keys and with repeated keys."""
    client = cyclone.Client(pool)
    figures = []
    for label in ("submit", "submit_once new", "submit_once repeat"):
        await truncate(pool)
        if label == "submit_once repeat":
            for i in range(n):
                await chain3.submit_once(client, f"k{i}", i)
        start = time.perf_counter()
        for i in range(n):
            if label == "submit":
                await chain3.submit(client, i)
            else:
                await chain3.submit_once(client, f"k{i}", i)
        figures.append(Figure(label, n / (time.perf_counter() - start), "calls/s", "3-node chain"))
    await truncate(pool)
    return figures
