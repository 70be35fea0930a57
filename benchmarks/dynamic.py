"""Workflows shaped at run time: a map node over 1,000 items, and workflows whose node has 20
child workflows (a map over a workflow), each beside the job drain of the same run, all
through one worker embedded in the benchmark's process at queue concurrency 16, and the plan
of the one statement that grows the 1,000 item nodes.

The map runs over the output of the node before it, so its items are grown in that node's
completion transaction, as in an application. The caller provides the history of finished
runs underneath; nothing here truncates it.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import asyncpg

import cyclone
from benchmarks.floor import Figure
from benchmarks.jobs import QUEUE, handled, noop

CONCURRENCY = 16


@cyclone.step("bench.count", queue=QUEUE)
async def count_up(ctx: cyclone.Context, n: int) -> list[int]:
    return list(range(n))


mapped = cyclone.define("bench.map", int)
mapped.map(noop, mapped.node(count_up, name="count"), name="items", max_items=100_000)

# A workflow whose one node has 20 child workflows: a map over a one-node workflow.
CHILDREN = 20
kid = cyclone.define_result("bench.kid", int, type(None))
kid.set_result(kid.node(noop, name="x"))
parent = cyclone.define("bench.children", list[int])
parent.map(kid, name="kids")

# The same map behind a wait node, so that a test of the plan can reach the map node when it
# chooses (the signal) and watch the expansion alone.
held = cyclone.define("bench.map_held", list[int])
held.map(noop, name="items", after=[held.wait("go")], max_items=100_000)


def _worker(client: cyclone.Client, workflow: cyclone.Workflow[Any]) -> cyclone.Worker:
    return cyclone.Worker(
        client, steps=[noop], workflows=[workflow], queues={QUEUE: CONCURRENCY}, poll_interval=0.05
    )


async def map_drain(pool: asyncpg.Pool, items: int = 1_000) -> Figure:
    """One run of a node whose output is ``items`` long and the map node over it, drained
    by a running embedded worker; nodes/s (the items and the node before them) from the
    submit to the run's end."""
    client = cyclone.Client(pool)
    async with _worker(client, mapped):
        start = time.perf_counter()
        run = await mapped.submit(client, items)
        if await run.wait(timeout=600) is not cyclone.RunState.COMPLETED:
            raise RuntimeError(f"benchmark run {run.id} did not complete")
        elapsed = time.perf_counter() - start
    return Figure(
        "map nodes",
        (items + 1) / elapsed,
        "nodes/s",
        f"1 run, a node and a map of {items:,} items over its output, embedded worker, "
        f"c={CONCURRENCY}",
    )


async def children_drain(pool: asyncpg.Pool, runs: int = 25) -> Figure:
    """``runs`` runs of a workflow whose node has 20 child workflows, submitted in one
    transaction to a running embedded worker; nodes/s (each item node and its child's node)
    from the first submit to the last run's end."""
    client = cyclone.Client(pool)
    async with _worker(client, parent):
        start = time.perf_counter()
        # One transaction, as the jobs beside it are one enqueue_many: one commit.
        async with pool.acquire() as raw, client.transaction(raw) as tx:
            items = list(range(CHILDREN))
            submitted = [await parent.submit_tx(client, tx, items) for _ in range(runs)]
        for run in submitted:
            if await run.wait(timeout=600) is not cyclone.RunState.COMPLETED:
                raise RuntimeError(f"benchmark run {run.id} did not complete")
        elapsed = time.perf_counter() - start
    nodes = runs * CHILDREN * 2
    return Figure(
        "child nodes",
        nodes / elapsed,
        "nodes/s",
        f"{runs} runs of a node with {CHILDREN} children in one transaction, {nodes:,} nodes "
        f"with the children's, embedded worker, c={CONCURRENCY}",
    )


async def job_drain(pool: asyncpg.Pool, jobs: int = 1_000) -> Figure:
    """``jobs`` no-op jobs enqueued in one call and drained by the same running embedded
    worker; jobs/s from the enqueue to the last completion written."""
    client = cyclone.Client(pool)
    handled.arm(jobs)
    async with _worker(client, mapped) as worker:
        start = time.perf_counter()
        await noop.enqueue_many(client, list(range(jobs)))
        await asyncio.wait_for(handled.done.wait(), 600)
        await worker.drain()  # every completion written, as the map's run end is
        elapsed = time.perf_counter() - start
    if left := await pool.fetchval("SELECT count(*) FROM cyclone_tasks"):
        raise RuntimeError(f"{left} jobs were left unfinished")
    return Figure(
        "map's job drain",
        jobs / elapsed,
        "jobs/s",
        f"{jobs:,} jobs in one enqueue_many, embedded worker, c={CONCURRENCY}",
    )


async def expansion_plan(pool: asyncpg.Pool, items: int = 1_000) -> str:
    """EXPLAIN ANALYZE of the statement that grows a reached map node's ``items`` item nodes
    (rolled back), in its text form."""
    client = cyclone.Client(pool)
    run = await held.submit(client, list(range(items)))
    async with pool.acquire() as conn:
        tx = conn.transaction()
        await tx.start()
        try:
            await conn.execute(
                "UPDATE cyclone_steps SET state = 'waiting' WHERE run_id = $1 AND node = 'items'",
                run.id,
            )
            rows = await conn.fetch(
                f"EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF, SUMMARY ON) "
                f"{client._queries['map_expand']}",
                [run.id],
                ["items"],
                None,
            )
            grown = await conn.fetchval(
                "SELECT count(*) FROM cyclone_steps WHERE run_id = $1 AND map_of = 'items'",
                run.id,
            )
        finally:
            await tx.rollback()
    await run.cancel()
    if grown != items:
        raise RuntimeError(f"the expansion grew {grown} item nodes, not {items}")
    return "\n".join(r[0] for r in rows)


NAMES = ("map nodes", "child nodes", "map's job drain")


def ratio_notes(results: dict[str, Figure]) -> list[str]:
    """Nodes per second of the map and of the child workflows over the job drain's jobs per
    second."""
    jobs = results["map's job drain"].value
    return [
        f"{name} / job drain: {results[name].value / jobs:.2f} (target at least 0.5)"
        for name in ("map nodes", "child nodes")
    ]
