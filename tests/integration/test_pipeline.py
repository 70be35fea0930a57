"""The worker pipeline: a slot is freed when its handler returns, unwritten outcomes hold back
claims, and input that no longer decodes fails the run at once. (Writing the outcomes:
test_outcomes.py.)"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable

import cyclone
from cyclone._worker import ahead as _ahead
from cyclone._worker import worker as _worker
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
    """A queue of one slot takes at most two unwritten outcomes for its slot and for each
    task it may claim ahead: one more task stays in its queue while those completions wait,
    and runs once they are written."""
    probe.reset()
    bound = _worker.UNWRITTEN_PER_SLOT * (1 + _ahead.most_ahead(1))
    assert bound > 2  # more than the slot's own two
    runs = [await quick.enqueue(cyclone_env.client, i) for i in range(bound + 1)]
    worker = fast_worker(cyclone_env.client, steps=[quick], queues={"pipe": 1})
    async with runs_locked(cyclone_env, runs) as release, worker:
        try:
            await completions_waiting(cyclone_env, 1)  # the outcomes wait to be written
            async with asyncio.timeout(30):
                while len(probe.calls) < bound:
                    probe.started.clear()
                    await probe.started.wait()
            # Nothing to await for a claim that must not happen: give the producer polls
            # (50 ms each) to take the last task if it were allowed to.
            await asyncio.sleep(0.5)
            assert sorted(probe.calls) == list(range(bound))
        finally:
            await release()
        for i, run in enumerate(runs):
            assert await run.result(timeout=30) == i
    assert sorted(probe.calls) == list(range(bound + 1))


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
