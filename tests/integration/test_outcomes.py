"""Writing an attempt's outcome: only while the attempt still owns its task (fenced against a
reclaim, in either order, the interleaving forced by real locks), and, after a lost reply,
confirmed from the record for every kind of outcome (completed, retried, failed)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import pytest

import cyclone
from cyclone._model.retention import Retentions
from cyclone._storage import queries as db
from cyclone._worker import maintenance
from cyclone._worker.completer import Completer
from cyclone._worker.outcomes import Claimed, Completed, Failed, Outcome, Retry, Snoozed
from cyclone.testing.plugin import CycloneEnv
from tests.conftest import waiting_on_a_lock


@cyclone.step("outcome.job")
async def job(ctx: cyclone.Context, n: int) -> int:
    return n


@cyclone.step("outcome.flaky", queue="outcome", max_attempts=3)
async def flaky(ctx: cyclone.Context, n: int) -> int:
    return n


async def claim(env: CycloneEnv, step: cyclone.Step[int, int], worker: str = "w") -> Claimed:
    """Claim the one task of ``step`` as worker ``worker``, as a producer would."""
    async with env.pool.acquire() as conn:
        [row] = await db.task_claim(
            conn, env.client._queries, db.ClaimRequest(step.queue, [step.name], 1, 30.0, worker, [])
        )
    return Claimed.from_row(row, queue=step.queue, worker="")


async def claimed_with_expired_lease(env: CycloneEnv) -> tuple[cyclone.ResultRun[int], Claimed]:
    run = await job.enqueue(env.client, 1)
    claimed = await claim(env, job, "w1")
    await env.pool.execute("UPDATE cyclone_tasks SET lease_until = now() - interval '1 hour'")
    return run, claimed


async def flaky_claimed(env: CycloneEnv) -> tuple[cyclone.ResultRun[int], Claimed]:
    run = await flaky.enqueue(env.client, 1)
    return run, await claim(env, flaky)


@contextlib.asynccontextmanager
async def running_completer(env: CycloneEnv) -> AsyncIterator[Completer]:
    """A completer writing outcomes until the block ends."""
    completer = Completer(env.client.services.database, env.client.services.publisher, bound=10)
    completer.start()
    try:
        yield completer
    finally:
        await completer.stop()


async def written(completer: Completer, outcome: Outcome) -> bool:
    """Whether the completer wrote ``outcome`` (or confirmed it from the record)."""
    return await asyncio.wait_for(completer.submit(outcome), 30)


def reply_lost_once(monkeypatch: pytest.MonkeyPatch, name: str) -> list[int]:
    """Make the first call of ``db.<name>`` commit, then lose its reply; the calls' row
    counts."""
    real = getattr(db, name)
    calls: list[int] = []

    async def lost(*args: Any, **kwargs: Any) -> Any:
        result = await real(*args, **kwargs)  # committed: one statement or transaction
        calls.append(len(result) if isinstance(result, list) else int(bool(result)))
        if len(calls) == 1:
            raise asyncpg.ConnectionDoesNotExistError("connection lost before the reply")
        return result

    monkeypatch.setattr(db, name, lost)
    return calls


async def test_completion_waiting_on_a_reclaim_is_rejected(cyclone_env: CycloneEnv) -> None:
    run, claimed = await claimed_with_expired_lease(cyclone_env)
    async with (
        running_completer(cyclone_env) as completer,
        cyclone_env.pool.acquire() as reclaimer,
    ):
        tx = reclaimer.transaction()
        await tx.start()
        assert len(await db.task_reclaim(reclaimer, cyclone_env.client._queries, 10)) == 1
        completing = completer.submit(Completed(claimed, "1"))
        await waiting_on_a_lock(cyclone_env)  # the completion waits for the reclaim
        await tx.commit()
        assert await asyncio.wait_for(completing, 30) is False  # fenced out
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
            cyclone_env.client._queries,
            db.Completions(db.Fence([claimed.run_id], [claimed.id], [claimed.claims]), ["1"]),
        )
        assert len(rows) == 1
        # Maintenance runs meanwhile: SKIP LOCKED passes the task by instead of waiting.
        await asyncio.wait_for(
            maintenance.run_once(
                cyclone_env.client.services, maintenance.Retaining(Retentions(None)), worker_id="m"
            ),
            30,
        )
        await tx.commit()
    info = await run.info()
    assert (info.state, info.nodes[0].errors) == (cyclone.RunState.COMPLETED, [])
    assert await run.result() == 1


async def test_a_completion_whose_reply_was_lost_counts_as_accepted(
    cyclone_env: CycloneEnv, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The completion commits, then its connection fails before the reply: the retry finds
    the task gone, and the record says the attempt completed it, so it is accepted."""
    run, claimed = await claimed_with_expired_lease(cyclone_env)
    await cyclone_env.pool.execute("UPDATE cyclone_tasks SET lease_until = now() + '1 hour'")
    writes = reply_lost_once(monkeypatch, "job_complete_many")
    async with running_completer(cyclone_env) as completer:
        assert await written(completer, Completed(claimed, "1")) is True
    assert writes == [1, 0]  # the second try matched nothing: fenced, applied once
    assert await run.result() == 1


async def test_a_retry_whose_reply_was_lost_counts_as_accepted(
    cyclone_env: CycloneEnv, monkeypatch: pytest.MonkeyPatch
) -> None:
    run, claimed = await flaky_claimed(cyclone_env)
    calls = reply_lost_once(monkeypatch, "task_retry_many")
    retry = Retry(claimed, 0.0, '{"type": "E"}', RuntimeError("E"), "failed")
    snooze = Snoozed(claimed, 60.0)  # the same attempt again: fenced out, not confirmed
    async with running_completer(cyclone_env) as completer:
        assert await written(completer, retry) is True
        assert await written(completer, snooze) is False
    assert calls == [1, 0, 0]  # the second try matched nothing: fenced, applied once
    info = await run.info()
    assert [e["type"] for e in info.nodes[0].errors] == ["E"]


async def test_a_failure_whose_reply_was_lost_counts_as_accepted(
    cyclone_env: CycloneEnv, monkeypatch: pytest.MonkeyPatch
) -> None:
    run, claimed = await flaky_claimed(cyclone_env)
    calls = reply_lost_once(monkeypatch, "task_fail")
    failed = Failed(claimed, '{"type": "E", "at": "now"}', RuntimeError("E"), "failed")
    async with running_completer(cyclone_env) as completer:
        assert await written(completer, failed) is True
    assert calls == [1, 0]
    assert await run.status() is cyclone.RunState.FAILED


async def test_only_the_completing_attempt_is_confirmed(cyclone_env: CycloneEnv) -> None:
    """The record names the attempt (task id, claim count) that completed a job or node."""
    run, claimed = await claimed_with_expired_lease(cyclone_env)
    q = cyclone_env.client._queries
    task, claims = claimed.id, claimed.claims

    async def confirmed(node: str | None, task: int, claims: int) -> bool:
        return bool(
            await db.attempts_completed(conn, q, db.Fence([run.id], [task], [claims]), [node])
        )

    async with cyclone_env.pool.acquire() as conn:
        assert not await confirmed(None, task, claims)  # not completed yet
        [done] = await db.job_complete_many(
            conn, q, db.Completions(db.Fence([run.id], [task], [claims]), ["1"])
        )
        assert done["run_id"] == run.id
        assert await confirmed(None, task, claims)
        assert not await confirmed(None, task, claims + 1)  # another claim of the task
        assert not await confirmed(None, task + 1, claims)  # another task
        assert not await confirmed("a", task, claims)  # a node of that name: none


async def test_released_and_failed_attempts_are_named_by_the_record(
    cyclone_env: CycloneEnv,
) -> None:
    """The record tells which attempt put its task back, or failed it, and no other."""
    q = cyclone_env.client._queries
    run, c = await flaky_claimed(cyclone_env)
    async with cyclone_env.pool.acquire() as conn:

        async def released(claims: int, attempt: int) -> bool:
            found = await db.attempts_released(
                conn, q, db.Fence([run.id], [c.id], [claims]), [attempt]
            )
            return bool(found)

        assert not await released(c.claims, c.attempt)  # still running
        await db.task_retry_many(
            conn, q, db.Fence([run.id], [c.id], [c.claims]), [0.0], [None], [True]
        )
        assert await released(c.claims, c.attempt)
        assert not await released(c.claims + 1, c.attempt)  # a later claim: not yet made
        # Claimed again, then reclaimed after its lease: that attempt was not released by us.
        again = await claim(cyclone_env, flaky)
        assert await released(c.claims, c.attempt)  # the first one's release still stands
        await conn.execute("UPDATE cyclone_tasks SET lease_until = now() - interval '1 hour'")
        await db.task_reclaim(conn, q, 10)
        assert not await released(again.claims, again.attempt)
        # Failures: found by their error record.
        third = await claim(cyclone_env, flaky)
        async with conn.transaction():
            assert await db.task_fail(conn, q, third, '{"n": 3}', expired_only=False)
        assert await db.attempts_failed(conn, q, [run.id], [None], ['{"n": 3}']) == {(run.id, None)}
        assert not await db.attempts_failed(conn, q, [run.id], [None], ['{"n": 2}'])


async def test_a_stale_attempt_of_a_retried_job_is_not_confirmed(
    cyclone_env: CycloneEnv, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Retrying a failed job starts its attempts from 1 again, so an attempt number names no
    attempt for good. A stale attempt 1 whose write failed once must stay rejected after the
    retried job's own attempt 1 completed."""
    q = cyclone_env.client._queries
    run, stale = await claimed_with_expired_lease(cyclone_env)
    async with cyclone_env.pool.acquire() as conn, conn.transaction():
        # Maintenance fails the job: its last attempt's lease expired.
        assert await db.task_fail(conn, q, stale, "{}", expired_only=True)
    await run.retry_all()
    async with cyclone_env.pool.acquire() as conn:
        [row] = await db.task_claim(
            conn, q, db.ClaimRequest("default", ["outcome.job"], 1, 30.0, "w2", [])
        )
    assert row["attempt"] == stale.attempt == 1
    real = db.job_complete_many
    tries: list[int] = []

    async def first_try_fails(*args: Any) -> list[asyncpg.Record]:
        tries.append(1)
        if len(tries) == 2:  # the stale attempt's first try
            raise asyncpg.ConnectionDoesNotExistError("connection lost")
        return await real(*args)

    monkeypatch.setattr(db, "job_complete_many", first_try_fails)
    async with running_completer(cyclone_env) as completer:
        fresh = dataclasses.replace(stale, id=row["id"], claims=row["claims"])
        assert await written(completer, Completed(fresh, "2")) is True
        assert await written(completer, Completed(stale, "1")) is False
    assert len(tries) == 3  # fresh; stale, lost; stale again, fenced out
    assert await run.result() == 2
