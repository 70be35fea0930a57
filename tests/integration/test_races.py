"""Completion against reclaim (both orders, interleaving forced by real locks) and lost replies."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import asyncpg
import pytest

import cyclone
from cyclone import _maintenance, _transitions
from cyclone import _queries as db
from cyclone._attempt import Claimed, Completed
from cyclone._completer import Completer
from cyclone.testing.plugin import CycloneEnv
from tests.conftest import count_rows, waiting_on_a_lock


@cyclone.step("race.job")
async def job(ctx: cyclone.Context, n: int) -> int:
    return n


async def claimed_with_expired_lease(env: CycloneEnv) -> tuple[cyclone.ResultRun[int], Claimed]:
    run = await job.enqueue(env.client, 1)
    async with env.pool.acquire() as conn:
        [row] = await db.task_claim(
            conn, env.client.queries, "default", ["race.job"], 1, 30.0, "w1", []
        )
    await env.pool.execute("UPDATE cyclone_tasks SET lease_until = now() - interval '1 hour'")
    claimed = Claimed(
        id=row["id"],
        run_id=row["run_id"],
        node=None,
        kind="race.job",
        queue="default",
        attempt=row["attempt"],
        max_attempts=row["max_attempts"],
        claims=row["claims"],
        run_name=row["name"],
        input=row["input"],
        deps=None,
    )
    return run, claimed


async def test_completion_waiting_on_a_reclaim_is_rejected(cyclone_env: CycloneEnv) -> None:
    run, claimed = await claimed_with_expired_lease(cyclone_env)
    completer = Completer(
        cyclone_env.client.services.database, cyclone_env.client.services.publisher, bound=10
    )
    completer.start()
    try:
        async with cyclone_env.pool.acquire() as reclaimer:
            tx = reclaimer.transaction()
            await tx.start()
            assert len(await db.task_reclaim(reclaimer, cyclone_env.client.queries, 10)) == 1
            completing = completer.submit(Completed(claimed, "1"))
            await waiting_on_a_lock(cyclone_env)  # the completion waits for the reclaim
            await tx.commit()
            assert await asyncio.wait_for(completing, 30) is False  # fenced out
    finally:
        await completer.stop()
    info = await run.info()
    assert (info.state, info.nodes[0].state) == (cyclone.RunState.RUNNING, "available")
    assert [e["type"] for e in info.nodes[0].errors] == ["LeaseExpired"]


async def test_reclaim_skips_a_task_being_completed(cyclone_env: CycloneEnv) -> None:
    run, claimed = await claimed_with_expired_lease(cyclone_env)
    async with cyclone_env.pool.acquire() as completer:
        tx = completer.transaction()
        await tx.start()
        rows = await db.job_complete_many(
            completer,
            cyclone_env.client.queries,
            [claimed.run_id],
            [claimed.id],
            [claimed.claims],
            ["1"],
        )
        assert len(rows) == 1
        # Maintenance runs meanwhile: SKIP LOCKED passes the task by instead of waiting.
        await asyncio.wait_for(
            _maintenance.run_once(cyclone_env.client.services, None, worker_id="m"), 30
        )
        await tx.commit()
    info = await run.info()
    assert (info.state, info.nodes[0].errors) == (cyclone.RunState.COMPLETED, [])
    assert await run.result() == 1


async def test_completion_whose_reply_was_lost_counts_as_accepted(
    cyclone_env: CycloneEnv, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The completion commits, then its connection fails before the reply: the retry finds
    the task gone, and the record says the attempt completed it, so it is accepted."""
    run, claimed = await claimed_with_expired_lease(cyclone_env)
    await cyclone_env.pool.execute("UPDATE cyclone_tasks SET lease_until = now() + '1 hour'")
    real = db.job_complete_many
    writes: list[int] = []

    async def reply_lost(*args: Any) -> list[asyncpg.Record]:
        rows = await real(*args)  # committed: one statement, its own transaction
        writes.append(len(rows))
        if len(writes) == 1:
            raise asyncpg.ConnectionDoesNotExistError("connection lost before the reply")
        return rows

    monkeypatch.setattr(db, "job_complete_many", reply_lost)
    completer = Completer(
        cyclone_env.client.services.database, cyclone_env.client.services.publisher, bound=10
    )
    completer.start()
    try:
        assert await asyncio.wait_for(completer.submit(Completed(claimed, "1")), 30) is True
    finally:
        await completer.stop()
    assert writes == [1, 0]  # the second try matched nothing: fenced, applied once
    assert await run.result() == 1


async def test_only_the_completing_attempt_is_confirmed(cyclone_env: CycloneEnv) -> None:
    """The record names the attempt (task id, claim count) that completed a job or node."""
    run, claimed = await claimed_with_expired_lease(cyclone_env)
    q = cyclone_env.client.queries
    task, claims = claimed.id, claimed.claims

    async def confirmed(node: str | None, task: int, claims: int) -> bool:
        return bool(await db.attempts_completed(conn, q, [run.id], [node], [task], [claims]))

    async with cyclone_env.pool.acquire() as conn:
        assert not await confirmed(None, task, claims)  # not completed yet
        [done] = await db.job_complete_many(conn, q, [run.id], [task], [claims], ["1"])
        assert done["run_id"] == run.id
        assert await confirmed(None, task, claims)
        assert not await confirmed(None, task, claims + 1)  # another claim of the task
        assert not await confirmed(None, task + 1, claims)  # another task
        assert not await confirmed("a", task, claims)  # a node of that name: none


async def test_a_stale_attempt_of_a_retried_job_is_not_confirmed(
    cyclone_env: CycloneEnv, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Retrying a failed job starts its attempts from 1 again, so an attempt number names no
    attempt for good. A stale attempt 1 whose write failed once must stay rejected after the
    retried job's own attempt 1 completed."""
    client, q = cyclone_env.client, cyclone_env.client.queries
    run, stale = await claimed_with_expired_lease(cyclone_env)
    async with cyclone_env.pool.acquire() as conn, conn.transaction():
        # Maintenance fails the job: its last attempt's lease expired.
        assert await db.last_attempt_fail(
            conn, q, "job_fail", stale.run_id, stale.id, stale.claims, "{}", expired_only=True
        )
    await run.retry_all()
    async with cyclone_env.pool.acquire() as conn:
        [row] = await db.task_claim(conn, q, "default", ["race.job"], 1, 30.0, "w2", [])
    assert row["attempt"] == stale.attempt == 1
    real = db.job_complete_many
    tries: list[int] = []

    async def first_try_fails(*args: Any) -> list[asyncpg.Record]:
        tries.append(1)
        if len(tries) == 2:  # the stale attempt's first try
            raise asyncpg.ConnectionDoesNotExistError("connection lost")
        return await real(*args)

    monkeypatch.setattr(db, "job_complete_many", first_try_fails)
    completer = Completer(client.services.database, client.services.publisher, bound=10)
    completer.start()
    try:
        fresh = dataclasses.replace(stale, id=row["id"], claims=row["claims"])
        assert await asyncio.wait_for(completer.submit(Completed(fresh, "2")), 30) is True
        assert await asyncio.wait_for(completer.submit(Completed(stale, "1")), 30) is False
    finally:
        await completer.stop()
    assert len(tries) == 3  # fresh; stale, lost; stale again, fenced out
    assert await run.result() == 2


@cyclone.step("race.once", max_attempts=1)
async def once(ctx: cyclone.Context, n: int) -> int:
    return n


async def test_cancel_waiting_on_a_job_retry_leaves_no_task(cyclone_env: CycloneEnv) -> None:
    """A retry re-opens a failed job and queues a new task; a cancel arrives while the retry's
    transaction holds the run. The cancel must see the new task once it gets the run, or the
    cancelled run keeps a claimable-looking task forever (and is never purged)."""
    q = cyclone_env.client.queries
    run = await once.enqueue(cyclone_env.client, 1)
    async with cyclone_env.pool.acquire() as conn:
        [row] = await db.task_claim(conn, q, "default", ["race.once"], 1, 30.0, "w", [])
        async with conn.transaction():
            assert await db.last_attempt_fail(
                conn, q, "job_fail", run.id, row["id"], row["claims"], "{}", expired_only=False
            )
    async with cyclone_env.pool.acquire() as retrier:
        tx = retrier.transaction()
        await tx.start()
        await _transitions.retry(retrier, q, run.id, None)  # re-opened, a new task queued
        cancelling = asyncio.get_running_loop().create_task(run.cancel())
        await waiting_on_a_lock(cyclone_env)  # the cancel waits for the retry's run lock
        await tx.commit()
        assert await asyncio.wait_for(cancelling, 30) is True
    assert await run.status() is cyclone.RunState.CANCELLED
    assert await count_rows(cyclone_env, "cyclone_tasks") == 0
    assert await cyclone_env.client.purge_terminal_runs(0) == 1
