"""sequence=: runs of one kind and key execute one at a time, in enqueue order, across workers;
a failed run (by its last attempt or its deadline) blocks its sequence until retried."""

from __future__ import annotations

import asyncio
import datetime as dt
import random
from collections.abc import AsyncIterator

import asyncpg
import pytest

import cyclone
from cyclone._services import transitions
from cyclone.testing.plugin import CycloneEnv
from tests.conftest import Probe, fast_worker

probe = Probe()
active: dict[str, int] = {}


@cyclone.step("seq.work", queue="seq", max_attempts=1)
async def seq_work(ctx: cyclone.Context, item: list[str]) -> None:
    sequence, label = item
    active[sequence] = active.get(sequence, 0) + 1
    overlap = active[sequence] > 1
    await asyncio.sleep(random.uniform(0, 0.01))
    probe.calls.append((ctx.client.schema, sequence, label, overlap))
    active[sequence] -= 1
    if label == "fail" and "healed" not in probe.calls:
        raise RuntimeError("this one fails")


@pytest.fixture
async def two_clients(cyclone_env: CycloneEnv) -> AsyncIterator[list[cyclone.Client]]:
    probe.reset()
    active.clear()
    other = await asyncpg.create_pool(cyclone_env.dsn, min_size=1, max_size=10)
    try:
        yield [cyclone_env.client, cyclone.Client(other)]
    finally:
        await other.close()


async def test_one_at_a_time_in_enqueue_order_across_two_workers(
    cyclone_env: CycloneEnv, two_clients: list[cyclone.Client]
) -> None:
    client = cyclone_env.client
    runs = []
    for batch in range(4):
        for seq in ("a", "b"):
            runs += await seq_work.enqueue_many(
                client, [[seq, f"{batch}.{i}"] for i in range(5)], sequence=seq
            )
    free = await seq_work.enqueue_many(client, [["free", str(i)] for i in range(10)])
    workers = [fast_worker(c, steps=[seq_work], queues={"seq": 8}) for c in two_clients]
    async with workers[0], workers[1]:
        for run in runs + free:
            assert await run.wait(timeout=60) is cyclone.RunState.COMPLETED
    for seq in ("a", "b"):
        done = [(label, overlap) for _, s, label, overlap in probe.calls if s == seq]
        assert [label for label, _ in done] == [f"{b}.{i}" for b in range(4) for i in range(5)]
        assert not any(overlap for _, overlap in done)


async def test_a_failed_run_blocks_its_sequence_until_retried(cyclone_env: CycloneEnv) -> None:
    probe.reset()
    client = cyclone_env.client
    head = await seq_work.enqueue(client, ["s", "fail"], sequence="s")
    rest = await seq_work.enqueue_many(client, [["s", "1"], ["s", "2"]], sequence="s")
    async with fast_worker(client, steps=[seq_work], queues={"seq": 1}, claim_batch=1):
        assert await head.wait(timeout=30) is cyclone.RunState.FAILED
        # Work enqueued later completes, so the worker has claimed past the blocked ones.
        sentinel = await seq_work.enqueue(client, ["other", "x"])
        await sentinel.wait(timeout=30)
        assert [await r.status() for r in rest] == [cyclone.RunState.PENDING] * 2
        probe.calls.append("healed")
        await head.retry_all()
        for run in [head, *rest]:
            assert await run.wait(timeout=30) is cyclone.RunState.COMPLETED
    labels = [c[2] for c in probe.calls if isinstance(c, tuple) and c[1] == "s"]
    assert labels == ["fail", "fail", "1", "2"]


async def test_cancelling_the_failed_run_unblocks_its_sequence(cyclone_env: CycloneEnv) -> None:
    probe.reset()
    client = cyclone_env.client
    head = await seq_work.enqueue(client, ["s", "fail"], sequence="s")
    after = await seq_work.enqueue(client, ["s", "after"], sequence="s")
    async with fast_worker(client, steps=[seq_work]):
        assert await head.wait(timeout=30) is cyclone.RunState.FAILED
        assert await head.cancel()  # a failed run can be cancelled: it gives up its place
        assert await after.wait(timeout=30) is cyclone.RunState.COMPLETED
    assert await head.status() is cyclone.RunState.CANCELLED


deadline_probe = Probe()


@cyclone.step("seq.until_deadline", queue="seq", max_attempts=1)
async def until_deadline(ctx: cyclone.Context, label: str) -> str:
    deadline_probe.calls.append((label, ctx.attempt))
    if label == "slow" and len(deadline_probe.calls) == 1:
        deadline_probe.started.set()
        await asyncio.sleep(3600)  # only the first run of it; the deadline ends it
    if label == "fail":
        raise RuntimeError("fails")
    return label


async def test_deadline_keeps_a_sequenced_job_blocking(cyclone_env: CycloneEnv) -> None:
    deadline_probe.reset()
    client = cyclone_env.client
    later = dt.datetime.now(dt.UTC) + dt.timedelta(hours=1)
    head = await until_deadline.enqueue(client, "slow", sequence="s", run_deadline=later)
    after = await until_deadline.enqueue(client, "after", sequence="s")
    async with fast_worker(client, steps=[until_deadline], lease=0.6) as worker:
        await asyncio.wait_for(deadline_probe.started.wait(), 30)  # then the deadline passes
        await cyclone_env.pool.execute(
            "UPDATE cyclone_runs SET deadline = now() WHERE id = $1", head.id
        )
        assert await head.wait(timeout=30) is cyclone.RunState.FAILED
        await asyncio.wait_for(worker.idle(), 30)  # the handler was stopped
        await cyclone_env.drain(steps=[until_deadline])
        assert await after.status() is cyclone.RunState.PENDING  # still blocked
        await head.retry_all()
        assert await after.wait(timeout=30) is cyclone.RunState.COMPLETED
    assert [label for label, _ in deadline_probe.calls] == ["slow", "slow", "after"]


async def test_deadline_after_the_last_failure_leaves_the_blocker(cyclone_env: CycloneEnv) -> None:
    deadline_probe.reset()
    client = cyclone_env.client
    head = await until_deadline.enqueue(client, "fail", sequence="s")
    await cyclone_env.drain(steps=[until_deadline])
    assert await head.status() is cyclone.RunState.FAILED
    # Maintenance had read the run as overdue before the failure committed, and acts now.
    async with cyclone_env.pool.acquire() as conn, conn.transaction():
        effects = await transitions.expire_deadline(
            conn, client._queries, head.id, "null", job=True
        )
    assert not effects.ended
    state = await cyclone_env.pool.fetchval(
        "SELECT state FROM cyclone_tasks WHERE run_id = $1", head.id
    )
    assert state == "failed"  # the sequence stays blocked
