"""The completion transaction: business writes and follow-up work commit with the step.

Every way an attempt can end without completing rolls all of it back.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

import asyncpg
import msgspec
import pytest

import cyclone
from cyclone.testing.plugin import CycloneEnv
from tests.conftest import Listener, Probe, fast_worker


class Job(msgspec.Struct):
    mode: str
    arg: float = 0.0


class FollowUp(msgspec.Struct):
    source: str


probe = Probe()

# A producer-only declaration: no handler for it in this process.
follow_up = cyclone.register_kind("follow.up", FollowUp, None, queue="later")


async def write_effects(ctx: cyclone.Context, note: str) -> None:
    conn = await ctx.completion_tx()
    await conn.execute(
        "INSERT INTO effects (run_id, attempt, note) VALUES ($1, $2, $3)",
        ctx.run_id,
        ctx.attempt,
        note,
    )
    await cyclone.enqueue_completion(ctx, ctx.client, follow_up, FollowUp(note))


@cyclone.step("effectful", max_attempts=2, timeout=5)
async def effectful(ctx: cyclone.Context, job: Job) -> str:
    await write_effects(ctx, job.mode)
    probe.calls.append((job.mode, ctx.attempt))
    if job.mode == "ok":
        return "done"
    if job.mode == "error":
        raise RuntimeError("handler failed after writing")
    if job.mode == "snooze" and ctx.attempt == 1 and len(probe.calls) == 1:
        raise cyclone.Snooze(0)
    if job.mode == "big":
        return "x" * 200
    if job.mode == "slow":
        await asyncio.sleep(60)  # over the step's timeout
    if job.mode == "wait-cancel":
        probe.started.set()
        await asyncio.sleep(3600)
    if job.mode == "stall-first" and ctx.attempt == 1:
        probe.started.set()
        try:
            await probe.stopped.wait()  # until the test has seen another worker complete it
        finally:
            probe.calls.append("first attempt returning")
    return job.mode


@pytest.fixture
async def effects_env(cyclone_env: CycloneEnv) -> CycloneEnv:
    probe.reset()
    await cyclone_env.pool.execute("CREATE TABLE effects (run_id uuid, attempt int, note text)")
    return cyclone_env


async def effects(env: CycloneEnv) -> list[tuple[Any, ...]]:
    rows = await env.pool.fetch("SELECT attempt, note FROM effects ORDER BY attempt")
    return [tuple(r) for r in rows]


async def follow_ups(env: CycloneEnv) -> int:
    return int(
        await env.pool.fetchval("SELECT count(*) FROM cyclone_runs WHERE name = 'follow.up'")
    )


async def test_success_commits_writes_and_follow_ups_with_the_step(
    effects_env: CycloneEnv, listener: Listener
) -> None:
    run = await effectful.enqueue(effects_env.client, Job("ok"))
    async with fast_worker(effects_env.client, steps=[effectful]):
        assert await run.result(timeout=30) == "done"
    assert await effects(effects_env) == [(1, "ok")]
    assert await follow_ups(effects_env) == 1
    await listener.settle()
    assert listener.counts()["q:later"] == 1  # published after the completion committed


@pytest.mark.parametrize(
    ("mode", "error_type"),
    [("error", "RuntimeError"), ("big", "PayloadTooLargeError"), ("slow", "Timeout")],
)
async def test_failed_attempts_roll_everything_back(
    effects_env: CycloneEnv, mode: str, error_type: str
) -> None:
    client = cyclone.Client(effects_env.pool, output_limit=100)
    run = await effectful.enqueue(client, Job(mode))
    async with fast_worker(client, steps=[effectful], lease=30):
        assert await run.wait(timeout=60) is cyclone.RunState.FAILED
    assert [e["type"] for e in (await run.info()).nodes[0].errors] == [error_type] * 2
    assert await effects(effects_env) == []
    assert await follow_ups(effects_env) == 0


async def test_snooze_rolls_back_its_attempt(effects_env: CycloneEnv) -> None:
    run = await effectful.enqueue(effects_env.client, Job("snooze"))
    async with fast_worker(effects_env.client, steps=[effectful]):
        assert await run.result(timeout=30) == "snooze"
    assert probe.calls == [("snooze", 1), ("snooze", 1)]
    assert await effects(effects_env) == [(1, "snooze")]  # only the completing attempt's
    assert await follow_ups(effects_env) == 1


async def test_cancelled_run_rolls_back_the_running_attempt(effects_env: CycloneEnv) -> None:
    run = await effectful.enqueue(effects_env.client, Job("wait-cancel"))
    worker = fast_worker(effects_env.client, steps=[effectful], lease=0.6)
    async with worker:
        await asyncio.wait_for(probe.started.wait(), 30)
        await run.cancel()
        await asyncio.wait_for(worker.idle(), 30)  # the heartbeat cancels the handler
    assert await run.status() is cyclone.RunState.CANCELLED
    assert await effects(effects_env) == []
    assert await follow_ups(effects_env) == 0


async def test_completion_after_a_reclaim_is_rejected(
    effects_env: CycloneEnv, caplog: pytest.LogCaptureFixture
) -> None:
    client = effects_env.client
    run = await effectful.enqueue(client, Job("stall-first"))
    # Worker A claims with a short lease and never renews it, as if its loop were blocked.
    stalled = fast_worker(
        client,
        steps=[effectful],
        lease=0.5,
        heartbeat=3600,
        maintenance_interval=3600,
        worker_id="stalled",
    )
    rescuer = fast_worker(client, steps=[effectful], lease=30, worker_id="rescuer")
    with caplog.at_level(logging.WARNING, logger="cyclone"):
        async with stalled:
            await asyncio.wait_for(probe.started.wait(), 30)
            async with rescuer:  # reclaims the expired lease and completes attempt 2
                assert await run.result(timeout=30) == "stall-first"
            probe.stopped.set()  # now let the first attempt return and try to complete
            await asyncio.wait_for(stalled.idle(), 30)
    assert "first attempt returning" in probe.calls
    assert "completion rejected" in caplog.text
    assert await effects(effects_env) == [(2, "stall-first")]
    assert await follow_ups(effects_env) == 1
    errors = (await run.info()).nodes[0].errors
    assert [e["type"] for e in errors] == ["LeaseExpired"]


contexts: list[cyclone.Context] = []


@cyclone.step("leaky")
async def leaky(ctx: cyclone.Context, n: int) -> str:
    contexts.append(ctx)

    async def elsewhere() -> Any:
        return await ctx.completion_tx()

    with pytest.raises(cyclone.ContextError, match="other than"):
        await asyncio.get_running_loop().create_task(elsewhere())
    return "ok"


async def test_context_belongs_to_the_handlers_task(cyclone_env: CycloneEnv) -> None:
    contexts.clear()
    run = await leaky.enqueue(cyclone_env.client, 1)
    async with fast_worker(cyclone_env.client, steps=[leaky]):
        assert await run.result(timeout=30) == "ok"
    with pytest.raises(cyclone.ContextError, match="after the handler returned"):
        await contexts[0].completion_tx()
    with pytest.raises(cyclone.ContextError):
        await cyclone.enqueue_completion(contexts[0], cyclone_env.client, follow_up, FollowUp("x"))


@cyclone.step("dedupe")
async def dedupe(ctx: cyclone.Context, key: str) -> str:
    producer = probe.calls[0]
    try:
        await cyclone.enqueue_completion(ctx, producer, follow_up, FollowUp(key), unique=key)
    except cyclone.DuplicateError as exc:
        outcome = f"duplicate of {exc.run_id}"
    else:
        outcome = "enqueued"
    conn = await ctx.completion_tx()  # still usable after the duplicate
    await conn.execute(
        "INSERT INTO effects (run_id, attempt, note) VALUES ($1, 1, $2)", ctx.run_id, outcome
    )
    return outcome


async def test_duplicate_in_completion_keeps_it_usable(effects_env: CycloneEnv) -> None:
    producer = cyclone.Client(effects_env.pool, notify=False)  # producer-only
    probe.calls.append(producer)
    holder = await follow_up.enqueue(producer, FollowUp("k"), unique="k")
    first = await dedupe.enqueue(effects_env.client, "k")
    second = await dedupe.enqueue(effects_env.client, "fresh")
    async with fast_worker(effects_env.client, steps=[dedupe]):
        assert await first.result(timeout=30) == f"duplicate of {holder.id}"
        assert await second.result(timeout=30) == "enqueued"
    assert sorted(n for _, n in await effects(effects_env)) == sorted(
        ["enqueued", f"duplicate of {holder.id}"]
    )
    assert await follow_ups(effects_env) == 2


@cyclone.step("aborting", max_attempts=3)
async def aborting(ctx: cyclone.Context, n: int) -> int:
    conn = await ctx.completion_tx()
    if ctx.attempt == 1:  # a failed statement caught by the handler: the transaction aborts
        with contextlib.suppress(asyncpg.DivisionByZeroError):
            await conn.execute("SELECT 1 / 0")
    return n


async def test_a_completion_transaction_the_server_refused_fails_the_attempt_at_once(
    cyclone_env: CycloneEnv,
) -> None:
    """Its completion statement fails (the transaction is aborted): nothing was written, for
    certain, so the attempt fails then and there and the next one runs, rather than waiting
    for the lease (a minute here) to run out."""
    run = await aborting.enqueue(cyclone_env.client, 7)
    async with fast_worker(cyclone_env.client, steps=[aborting], lease=60.0):
        assert await run.result(timeout=30) == 7
    [error] = (await run.info()).nodes[0].errors
    assert error["type"] == "CompletionAborted"
    assert "InFailedSQLTransactionError" in error["message"] and error["attempt"] == 1
