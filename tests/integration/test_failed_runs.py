"""A failed run starts nothing more; a node of it still running is parked when its attempt
ends; purge waits for such nodes; a cancel racing a retry of the run leaves no task behind."""

from __future__ import annotations

import asyncio
import datetime as dt

import asyncpg
import pytest

import cyclone
from cyclone._services import transitions
from cyclone._storage import queries as db
from cyclone.testing.plugin import CycloneEnv
from tests.conftest import Probe, count_rows, fast_worker, waiting_on_a_lock

probe = Probe()


@cyclone.step("failed.doomed", max_attempts=1)
async def doomed(ctx: cyclone.Context, n: int) -> int:
    raise RuntimeError("this branch fails")


@cyclone.step("failed.late", max_attempts=3)
async def late(ctx: cyclone.Context, n: int) -> int:
    probe.calls.append(ctx.attempt)
    if ctx.attempt == 1:
        await probe.stopped.wait()  # until the run has failed
        raise RuntimeError("fails after the run failed")
    return n


branches = cyclone.define("failed.branches", int)
branches.node(doomed)
branches.node(late)


async def test_a_failed_run_starts_nothing_more(cyclone_env: CycloneEnv) -> None:
    probe.reset()
    run = await branches.submit(cyclone_env.client, 1)
    async with fast_worker(cyclone_env.client, workflows=[branches]) as worker:
        assert await run.wait(timeout=30) is cyclone.RunState.FAILED
        probe.stopped.set()  # "late" now fails its first attempt, with attempts left
        await asyncio.wait_for(worker.drain(), 30)
        assert probe.calls == [1]  # not claimed again while the run is failed
        await run.retry_all()
        assert await run.wait(timeout=30) is cyclone.RunState.FAILED  # doomed fails again
    assert probe.calls == [1, 2]  # retry_all re-opened the run, and so the task


@cyclone.step("failed.quick", max_attempts=1)
async def quick(ctx: cyclone.Context, n: int) -> int:
    return n


@cyclone.step("failed.patient", max_attempts=3)
async def patient(ctx: cyclone.Context, n: int) -> int:
    return n


pair = cyclone.define("failed.pair", int)
pair.node(quick)
pair.node(patient)


async def failed_while_patient_runs(env: CycloneEnv) -> tuple[cyclone.Run, asyncpg.Record]:
    """A run of ``pair`` failed by its quick node's last attempt while its patient node runs;
    the patient node's claimed task."""
    q = env.client._queries
    run = await pair.submit(env.client, 1)
    async with env.pool.acquire() as conn:
        rows = await db.task_claim(
            conn,
            q,
            db.ClaimRequest(
                "default", ["failed.quick", "failed.patient"], 2, 30.0, "w", ["failed.pair"]
            ),
        )
        first = next(r for r in rows if r["kind"] == "failed.quick")
        async with conn.transaction():
            owned, _ = await transitions.fail_node_or_job(
                conn, q, db.TaskAttempt.of(first), "{}", expired_only=False
            )
        assert owned
    return run, next(r for r in rows if r["kind"] == "failed.patient")


@pytest.mark.parametrize("how", ["retried", "reclaimed"])
async def test_a_failed_runs_node_that_ends_an_attempt_is_parked(
    cyclone_env: CycloneEnv, how: str
) -> None:
    """A node still running when its run failed ends an attempt with attempts left (its
    handler failed, or its lease ran out). The run starts nothing more, so no available task
    may stay behind: it would count as backlog forever and keep the run from being purged.
    The node is parked, and a retry of the run goes on with its attempts."""
    client, q = cyclone_env.client, cyclone_env.client._queries
    run, second = await failed_while_patient_runs(cyclone_env)
    async with cyclone_env.pool.acquire() as conn:
        if how == "retried":
            assert await db.task_retry_many(
                conn,
                q,
                db.Fence([run.id], [second["id"]], [second["claims"]]),
                [0.0],
                ['{"n": 1}'],
                [False],
            )
        else:
            await conn.execute("UPDATE cyclone_tasks SET lease_until = now() - interval '1 hour'")
            assert len(await db.task_reclaim(conn, q, 10)) == 1
    assert await run.status() is cyclone.RunState.FAILED
    assert await count_rows(cyclone_env, "cyclone_tasks") == 0
    assert [s for s in await client.stats() if s.available or s.oldest_seconds] == []
    patient_node = next(n for n in (await run.info()).nodes if n.name == "failed.patient")
    assert (patient_node.state, patient_node.attempts, len(patient_node.errors)) == (
        "pending",
        1,
        1,
    )
    await run.retry_all()
    async with cyclone_env.pool.acquire() as conn:
        rows = await db.task_claim(
            conn, q, db.ClaimRequest("default", ["failed.patient"], 1, 30.0, "w", ["failed.pair"])
        )
    assert [r["attempt"] for r in rows] == [2]  # it goes on where it stopped


async def test_purge_waits_for_running_nodes_and_takes_parked_tasks(
    cyclone_env: CycloneEnv,
) -> None:
    """A failed run stays while a node of it still runs; an available task it kept (a retry
    racing the run's failure can leave one) is deleted with it."""
    client = cyclone_env.client
    run, _ = await failed_while_patient_runs(cyclone_env)
    assert await client.purge_terminal_runs(0) == 0  # failed.patient still runs
    await cyclone_env.pool.execute(
        "UPDATE cyclone_tasks SET state = 'available', lease_until = NULL WHERE run_id = $1",
        run.id,
    )
    assert await client.purge_terminal_runs(0) == 1
    assert await count_rows(cyclone_env, "cyclone_tasks") == 0


@cyclone.step("failed.once", max_attempts=1)
async def once(ctx: cyclone.Context, n: int) -> int:
    return n


async def test_cancel_waiting_on_a_job_retry_leaves_no_task(cyclone_env: CycloneEnv) -> None:
    """A retry re-opens a failed job and queues a new task; a cancel arrives while the retry's
    transaction holds the run. The cancel must see the new task once it gets the run, or the
    cancelled run keeps a claimable-looking task forever (and is never purged)."""
    q = cyclone_env.client._queries
    run = await once.enqueue(cyclone_env.client, 1)
    async with cyclone_env.pool.acquire() as conn:
        [row] = await db.task_claim(
            conn, q, db.ClaimRequest("default", ["failed.once"], 1, 30.0, "w", [])
        )
        async with conn.transaction():
            assert await db.task_fail(conn, q, db.TaskAttempt.of(row), "{}", expired_only=False)
    async with cyclone_env.pool.acquire() as retrier:
        tx = retrier.transaction()
        await tx.start()
        await transitions.retry(retrier, q, run.id, None)  # re-opened, a new task queued
        cancelling = asyncio.get_running_loop().create_task(run.cancel())
        await waiting_on_a_lock(cyclone_env)  # the cancel waits for the retry's run lock
        await tx.commit()
        assert await asyncio.wait_for(cancelling, 30) is True
    assert await run.status() is cyclone.RunState.CANCELLED
    assert await count_rows(cyclone_env, "cyclone_tasks") == 0
    assert await cyclone_env.client.purge_terminal_runs(0) == 1


@cyclone.step("failed.slow", max_attempts=1)
async def slow_failure(ctx: cyclone.Context, n: int) -> int:
    await asyncio.sleep(0.2)  # the attempt's length: what its record must span
    raise RuntimeError("slow to fail")


async def test_a_failed_attempt_records_when_it_started(cyclone_env: CycloneEnv) -> None:
    """Each error record says when its attempt was claimed and when it failed, so that its
    length can be shown (the dashboard's attempts)."""
    run = await slow_failure.enqueue(cyclone_env.client, 1)
    await cyclone_env.drain(steps=[slow_failure])
    [error] = (await run.info()).nodes[0].errors
    started = dt.datetime.fromisoformat(error["started_at"])
    failed = dt.datetime.fromisoformat(error["at"])
    assert started.tzinfo is not None
    assert failed - started >= dt.timedelta(seconds=0.2)
