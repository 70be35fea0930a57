"""The worker pipeline: a slot is freed when its handler returns, unwritten outcomes hold back
claims, every kind of outcome is confirmed from the record after a lost reply, and input that
no longer decodes fails the run at once."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import asyncpg
import pytest

import cyclone
from cyclone import _queries as db
from cyclone._attempt import Claimed, Failed, Retry, Snoozed
from cyclone._completer import Completer
from cyclone.testing.plugin import CycloneEnv
from tests.conftest import Probe, fast_worker

probe = Probe()


@cyclone.step("pipe.quick", queue="pipe")
async def quick(ctx: cyclone.Context, n: int) -> int:
    probe.calls.append(n)
    probe.started.set()
    return n


@contextlib.asynccontextmanager
async def runs_locked(
    env: CycloneEnv, runs: list[cyclone.Run]
) -> AsyncIterator[Callable[[], Awaitable[None]]]:
    """Hold the runs' rows locked (their completions wait; the claim only reads runs) until
    the block awaits what it is given, or ends."""
    async with env.pool.acquire() as blocker:
        tx = blocker.transaction()
        await tx.start()
        await blocker.execute(
            "SELECT 1 FROM cyclone_runs WHERE id = ANY ($1::uuid[]) FOR UPDATE",
            [r.id for r in runs],
        )
        released = False

        async def release() -> None:
            nonlocal released
            if not released:
                released = True
                await tx.rollback()

        try:
            yield release
        finally:
            await release()


async def completions_waiting(env: CycloneEnv, n: int) -> None:
    """Until ``n`` sessions wait on a lock (observed, not slept on)."""
    async with asyncio.timeout(30):
        while (  # noqa: ASYNC110 - another session's state
            await env.pool.fetchval(
                "SELECT count(*) FROM pg_stat_activity"
                " WHERE datname = current_database() AND wait_event_type = 'Lock'"
            )
            < n
        ):
            await asyncio.sleep(0.01)


async def test_a_slot_is_free_once_its_handler_returns(cyclone_env: CycloneEnv) -> None:
    """With one slot, the next task starts while the first one's completion still waits to
    be written (here on a lock), instead of after it."""
    probe.reset()
    first = await quick.enqueue(cyclone_env.client, 1)
    second = await quick.enqueue(cyclone_env.client, 2)
    worker = fast_worker(cyclone_env.client, steps=[quick], queues={"pipe": 1})
    async with runs_locked(cyclone_env, [first]) as release, worker:
        try:
            await completions_waiting(cyclone_env, 1)
            async with asyncio.timeout(10):  # before: never, the slot waited for the write
                while 2 not in probe.calls:
                    probe.started.clear()
                    await probe.started.wait()
        finally:
            await release()  # before the worker stops: it waits for the completion
        assert await first.result(timeout=30) == 1
        assert await second.result(timeout=30) == 2


async def test_unwritten_outcomes_hold_back_claims(cyclone_env: CycloneEnv) -> None:
    """One slot takes at most two unwritten outcomes: a third task stays in its queue while
    the two completions wait, and runs once they are written."""
    probe.reset()
    runs = [await quick.enqueue(cyclone_env.client, i) for i in range(3)]
    worker = fast_worker(cyclone_env.client, steps=[quick], queues={"pipe": 1})
    async with runs_locked(cyclone_env, runs) as release, worker:
        try:
            await completions_waiting(cyclone_env, 2)  # two outcomes buffered, being written
            # Nothing to await for a claim that must not happen: give the producer polls
            # (50 ms each) to take the third task if it were allowed to.
            await asyncio.sleep(0.5)
            assert sorted(probe.calls) == [0, 1]
        finally:
            await release()
        for i, run in enumerate(runs):
            assert await run.result(timeout=30) == i
    assert sorted(probe.calls) == [0, 1, 2]


@cyclone.step("pipe.typed", queue="pipe", max_attempts=5)
async def typed(ctx: cyclone.Context, n: int) -> int:
    probe.calls.append(n)
    return n


async def test_input_that_no_longer_decodes_fails_the_run_at_once(
    cyclone_env: CycloneEnv,
) -> None:
    """A payload stored when the input type was different (a deploy changed it) cannot
    succeed on any attempt: the run fails on the first, with a typed, readable error."""
    probe.reset()
    run = await typed.enqueue(cyclone_env.client, 1)
    await cyclone_env.pool.execute(
        """UPDATE cyclone_runs SET input = '{"user": 1}' WHERE id = $1""", run.id
    )
    async with fast_worker(cyclone_env.client, steps=[typed]):
        assert await run.wait(timeout=30) is cyclone.RunState.FAILED
    info = await run.info()
    [error] = info.nodes[0].errors
    assert error["type"] == "InvalidInputError" and error["attempt"] == 1
    assert "does not decode as the type this code declares" in error["message"]
    assert "Expected `int`, got `object`" in error["message"]
    assert probe.calls == []  # the handler never ran


@cyclone.step("pipe.flaky", queue="pipe", max_attempts=3)
async def flaky(ctx: cyclone.Context, n: int) -> int:
    return n


async def claim(env: CycloneEnv, run: cyclone.Run) -> Claimed:
    async with env.pool.acquire() as conn:
        [row] = await db.task_claim(
            conn, env.client.queries, "pipe", ["pipe.flaky"], 1, 30.0, "w", []
        )
    return Claimed(
        id=row["id"],
        run_id=row["run_id"],
        node=None,
        kind="pipe.flaky",
        queue="pipe",
        attempt=row["attempt"],
        max_attempts=row["max_attempts"],
        claims=row["claims"],
        run_name=row["name"],
        input=row["input"],
        deps=None,
    )


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


async def test_a_retry_whose_reply_was_lost_counts_as_accepted(
    cyclone_env: CycloneEnv, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = await flaky.enqueue(cyclone_env.client, 1)
    claimed = await claim(cyclone_env, run)
    calls = reply_lost_once(monkeypatch, "task_retry_many")
    env = cyclone_env
    completer = Completer(env.client.services.database, env.client.services.publisher, bound=10)
    completer.start()
    try:
        retry = Retry(claimed, 0.0, '{"type": "E"}', RuntimeError("E"), "failed")
        snooze = Snoozed(claimed, 60.0)  # the same attempt again: fenced out, not confirmed
        assert await asyncio.wait_for(completer.submit(retry), 30) is True
        assert await asyncio.wait_for(completer.submit(snooze), 30) is False
    finally:
        await completer.stop()
    assert calls == [1, 0, 0]  # the second try matched nothing: fenced, applied once
    info = await run.info()
    assert [e["type"] for e in info.nodes[0].errors] == ["E"]


async def test_a_failure_whose_reply_was_lost_counts_as_accepted(
    cyclone_env: CycloneEnv, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = await flaky.enqueue(cyclone_env.client, 1)
    claimed = await claim(cyclone_env, run)
    calls = reply_lost_once(monkeypatch, "last_attempt_fail")
    env = cyclone_env
    completer = Completer(env.client.services.database, env.client.services.publisher, bound=10)
    completer.start()
    try:
        error = '{"type": "E", "at": "now"}'
        failed = Failed(claimed, error, RuntimeError("E"), "failed")
        assert await asyncio.wait_for(completer.submit(failed), 30) is True
    finally:
        await completer.stop()
    assert calls == [1, 0]
    assert await run.status() is cyclone.RunState.FAILED


async def test_released_and_failed_attempts_are_named_by_the_record(
    cyclone_env: CycloneEnv,
) -> None:
    """The record tells which attempt put its task back, or failed it, and no other."""
    q = cyclone_env.client.queries
    run = await flaky.enqueue(cyclone_env.client, 1)
    c = await claim(cyclone_env, run)
    async with cyclone_env.pool.acquire() as conn:

        async def released(claims: int, attempt: int) -> bool:
            found = await db.attempts_released(conn, q, [run.id], [c.id], [claims], [attempt])
            return bool(found)

        assert not await released(c.claims, c.attempt)  # still running
        await db.task_retry_many(conn, q, [run.id], [c.id], [c.claims], [0.0], [None], [True])
        assert await released(c.claims, c.attempt)
        assert not await released(c.claims + 1, c.attempt)  # a later claim: not yet made
        # Claimed again, then reclaimed after its lease: that attempt was not released by us.
        again = await claim(cyclone_env, run)
        assert await released(c.claims, c.attempt)  # the first one's release still stands
        await conn.execute("UPDATE cyclone_tasks SET lease_until = now() - interval '1 hour'")
        await db.task_reclaim(conn, q, 10)
        assert not await released(again.claims, again.attempt)
        # Failures: found by their error record.
        third = await claim(cyclone_env, run)
        async with conn.transaction():
            assert await db.last_attempt_fail(
                conn, q, "job_fail", run.id, third.id, third.claims, '{"n": 3}', expired_only=False
            )
        assert await db.attempts_failed(conn, q, [run.id], [None], ['{"n": 3}']) == {(run.id, None)}
        assert not await db.attempts_failed(conn, q, [run.id], [None], ['{"n": 2}'])
