"""The chaos suite's processes: ``python -m tests.chaos.app work|produce DSN ...``.

``work DSN LEASE`` runs a worker for ``chaos.job``, the three-node ``chaos.flow``,
``chaos.map`` (a node whose output a map node runs over, then a node after it) and
``chaos.child`` (a node, a child node running ``chaos.kid``, a node after it). Every
attempt first records an "attempt started" row on a separate autocommit pool (at-least-once
evidence of execution), then writes its effect row in the completion transaction (so it
commits with the completion, exactly once). With ``CHAOS_ORDERS=1`` the completion transaction
also writes an order row to ``chaos_orders``, a table the Citus scenarios distribute over their
worker nodes, so a completion spans the coordinator and a worker node. Logs go to stderr as JSON
lines, with the run, node and attempt, so the suite can tell whether an ERROR was about
something that in fact succeeded.

``produce DSN RATE job|flow|map|child`` enqueues at a steady rate until SIGINT/SIGTERM; each run
gets its ledger row, with the nodes it must run, in the transaction that enqueues it, so a ledger
row exists iff its run does.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import sys
import time

import asyncpg
import msgspec

import cyclone

QUEUE = "chaos"
SCHEMA = """
CREATE TABLE chaos_ledger (run_id uuid PRIMARY KEY, seq bigint NOT NULL, nodes text[] NOT NULL);
-- No unique constraint: a duplicated effect must be counted, not refused.
CREATE TABLE chaos_effects (run_id uuid NOT NULL, node text NOT NULL, attempt int NOT NULL,
                            pid int NOT NULL);
CREATE TABLE chaos_attempts (run_id uuid NOT NULL, node text NOT NULL, attempt int NOT NULL,
                             pid int NOT NULL, at timestamptz NOT NULL DEFAULT clock_timestamp());
"""
WORK = float(os.environ.get("CHAOS_WORK", 0.05))  # seconds each handler takes
ORDERS = os.environ.get("CHAOS_ORDERS") == "1"
"""Whether each effect also writes a row of ``chaos_orders``, a table the scenario has
distributed over Citus worker nodes (by ``tenant``), in the same completion transaction."""
TENANTS = 16
"""Tenants an order belongs to (a run's ``seq`` modulo this), and the orders' shards."""


class Job(msgspec.Struct, frozen=True):
    """A job's input: its sequence number, and seconds to block the event loop for."""

    seq: int
    block: float = 0.0


_attempts: asyncpg.Pool | None = None  # the worker's separate autocommit pool


async def _record(ctx: cyclone.Context, job: Job) -> int:
    """The body of every handler: attempt row, optional blocking, effect row."""
    assert _attempts is not None
    node = ctx.node or ""
    await _attempts.execute(
        "INSERT INTO chaos_attempts (run_id, node, attempt, pid) VALUES ($1, $2, $3, $4)",
        ctx.run_id,
        node,
        ctx.attempt,
        os.getpid(),
    )
    if job.block and ctx.attempt == 1:
        time.sleep(job.block)  # noqa: ASYNC251 - the fault: a handler blocking the event loop
    await asyncio.sleep(WORK)  # the handler's own work: a kill finds attempts in flight
    conn = await ctx.completion_tx()
    await conn.execute(
        "INSERT INTO chaos_effects (run_id, node, attempt, pid) VALUES ($1, $2, $3, $4)",
        ctx.run_id,
        node,
        ctx.attempt,
        os.getpid(),
    )
    if ORDERS:
        await conn.execute(
            "INSERT INTO chaos_orders (tenant, run_id, node, attempt) VALUES ($1, $2, $3, $4)",
            job.seq % TENANTS,
            ctx.run_id,
            node,
            ctx.attempt,
        )
    return job.seq


@cyclone.step("chaos.job", queue=QUEUE, max_attempts=100)
async def job(ctx: cyclone.Context, item: Job) -> int:
    return await _record(ctx, item)


@cyclone.step("chaos.a", queue=QUEUE, max_attempts=100)
async def node_a(ctx: cyclone.Context, item: Job) -> int:
    return await _record(ctx, item)


@cyclone.step("chaos.b", queue=QUEUE, max_attempts=100)
async def node_b(ctx: cyclone.Context, item: Job) -> int:
    return await _record(ctx, item)


@cyclone.step("chaos.c", queue=QUEUE, max_attempts=100)
async def node_c(ctx: cyclone.Context, item: Job) -> int:
    return await _record(ctx, item)


MAP_ITEMS = 3


@cyclone.step("chaos.split", queue=QUEUE, max_attempts=100)
async def split(ctx: cyclone.Context, item: Job) -> list[Job]:
    await _record(ctx, item)
    return [item] * MAP_ITEMS


flow = cyclone.define("chaos.flow", Job)
_a = flow.node(node_a, name="a")
_b = flow.node(node_b, name="b", after=[_a])
flow.node(node_c, name="c", after=[_b])

# The items are written in the transaction that completes "a": a kill around it leaves all
# three or none, and a reclaimed "a" must not expand the map twice.
mapped = cyclone.define("chaos.map", Job)
_m = mapped.map(node_b, mapped.node(split, name="a"), name="m", max_parallel=2)
mapped.node(node_c, name="c", after=[_m])

# The child run is submitted in the transaction that completes "k"'s attempt: a kill around
# it leaves one child or none, and a reclaimed "k" must not submit a second.
kid = cyclone.define("chaos.kid", Job)
kid.node(node_b, name="x")
childed = cyclone.define("chaos.child", Job)
_k = childed.child(kid, name="k", after=[childed.node(node_a, name="a")], max_attempts=100)
childed.node(node_c, name="c", after=[_k])

NODES = {
    "job": [""],
    "flow": ["a", "b", "c"],
    "map": ["a", *(f"m[{i}]" for i in range(MAP_ITEMS)), "c"],
    "child": ["a", "c"],
}
"""The nodes each producer mode's run must run exactly once (a job's effect has no node);
a child run must run its own ("x"), which the harness expects of every child run."""


async def enqueue_ledgered(client: cyclone.Client, item: Job, *, mode: str = "job") -> None:
    """Enqueue one job (or submit one flow or map run) and its ledger row in one
    transaction."""
    # A tracked transaction: its wakeups go out after the commit, so workers claim at once.
    async with client.pool.acquire() as raw, client.transaction(raw) as conn:
        if mode == "flow":
            run = await flow.submit_tx(client, conn, item)
        elif mode == "map":
            run = await mapped.submit_tx(client, conn, item)
        elif mode == "child":
            run = await childed.submit_tx(client, conn, item)
        else:
            run = await job.enqueue_tx(client, conn, item)
        await conn.execute(
            "INSERT INTO chaos_ledger (run_id, seq, nodes) VALUES ($1, $2, $3)",
            run.id,
            item.seq,
            NODES[mode],
        )


class _JsonLines(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line = {
            "at": record.created,
            "level": record.levelname,
            "msg": record.getMessage(),
            "run_id": getattr(record, "run_id", None),
            "node": getattr(record, "node", None),
            "attempt": getattr(record, "attempt", None),
        }
        if record.exc_info:
            line["exc"] = self.formatException(record.exc_info)
        return json.dumps(line)


def _log_to_stderr() -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_JsonLines())
    logging.basicConfig(level=logging.WARNING, handlers=[handler])


def _stop_on_signals() -> asyncio.Event:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    return stop


def _backoff(attempt: int) -> float:
    # Retries here are failures the faults caused (a lost connection under the attempt row):
    # come back soon, so the scenario measures Cyclone's recovery rather than a backoff.
    return min(0.2 * attempt, 1.0)


async def work(dsn: str, lease: float) -> None:
    global _attempts
    stop = _stop_on_signals()
    async with (
        asyncpg.create_pool(dsn, min_size=2, max_size=12) as pool,
        asyncpg.create_pool(dsn, min_size=1, max_size=6) as attempts,
    ):
        _attempts = attempts
        client = cyclone.Client(pool)
        worker = cyclone.Worker(
            client, steps=[job], workflows=[flow, mapped, childed], lease=lease, backoff=_backoff
        )
        async with worker:
            print("ready", flush=True)
            await stop.wait()


async def produce(dsn: str, rate: float, mode: str) -> None:
    stop = _stop_on_signals()
    failures = 0
    async with asyncpg.create_pool(dsn, min_size=1, max_size=2) as pool:
        client = cyclone.Client(pool, notify=False)
        print("ready", flush=True)
        seq, start = 0, time.monotonic()
        while not stop.is_set():
            seq += 1
            try:
                async with asyncio.timeout(10):
                    await enqueue_ledgered(client, Job(seq), mode=mode)
            except (
                TimeoutError,
                OSError,
                asyncpg.PostgresError,
                asyncpg.InterfaceError,
                asyncpg.InternalClientError,  # asyncpg's, on a connection the server ended
            ) as exc:
                failures += 1  # rolled back or never sent: no run and no ledger row (or both)
                if failures % 50 == 1:
                    print(f"enqueue failed ({failures} so far): {exc!r}", file=sys.stderr)
            # A steady rate: never burst to catch up on time lost to a fault.
            delay = start + seq / rate - time.monotonic()
            if delay < 0:
                start -= delay
            else:
                await asyncio.sleep(delay)
    print(json.dumps({"enqueue_failures": failures}), flush=True)


if __name__ == "__main__":
    command, dsn = sys.argv[1], sys.argv[2]
    _log_to_stderr()
    if command == "work":
        asyncio.run(work(dsn, float(sys.argv[3])))
    else:
        asyncio.run(produce(dsn, float(sys.argv[3]), sys.argv[4]))
