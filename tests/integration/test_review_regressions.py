"""Regressions for races and edge cases found in review, each reproduced before the fix."""

from __future__ import annotations

import asyncio
import datetime as dt

import asyncpg
import pytest

import cyclone
from cyclone import _queries as db
from cyclone import _transitions
from cyclone.testing.plugin import CycloneEnv
from tests.conftest import Probe, count_rows, fast_worker

probe = Probe()


@cyclone.step("rr.seq", queue="rr", max_attempts=1)
async def seq_step(ctx: cyclone.Context, label: str) -> str:
    probe.calls.append((label, ctx.attempt))
    if label == "slow" and len(probe.calls) == 1:
        probe.started.set()
        await asyncio.sleep(3600)  # only the first run of it; the deadline ends it
    if label == "fail":
        raise RuntimeError("fails\x00with a NUL")
    return label


async def test_deadline_keeps_a_sequenced_job_blocking(cyclone_env: CycloneEnv) -> None:
    probe.reset()
    client = cyclone_env.client
    later = dt.datetime.now(dt.UTC) + dt.timedelta(hours=1)
    head = await seq_step.enqueue(client, "slow", sequence="s", run_deadline=later)
    after = await seq_step.enqueue(client, "after", sequence="s")
    async with fast_worker(client, steps=[seq_step], lease=0.6) as worker:
        await asyncio.wait_for(probe.started.wait(), 30)  # then the deadline passes
        await cyclone_env.pool.execute(
            "UPDATE cyclone_runs SET deadline = now() WHERE id = $1", head.id
        )
        assert await head.wait(timeout=30) is cyclone.RunState.FAILED
        await asyncio.wait_for(worker.idle(), 30)  # the handler was stopped
        await cyclone_env.drain(steps=[seq_step])
        assert await after.status() is cyclone.RunState.PENDING  # still blocked
        await head.retry_all()
        assert await after.wait(timeout=30) is cyclone.RunState.COMPLETED
    assert [label for label, _ in probe.calls] == ["slow", "slow", "after"]


async def test_deadline_after_the_last_failure_leaves_the_blocker(cyclone_env: CycloneEnv) -> None:
    probe.reset()
    client = cyclone_env.client
    head = await seq_step.enqueue(client, "fail", sequence="s")
    await cyclone_env.drain(steps=[seq_step])
    assert await head.status() is cyclone.RunState.FAILED
    # Maintenance had read the run as overdue before the failure committed, and acts now.
    async with cyclone_env.pool.acquire() as conn, conn.transaction():
        effects = await _transitions.expire_deadline(
            conn, client.queries, head.id, "null", job=True
        )
    assert not effects.ended
    state = await cyclone_env.pool.fetchval(
        "SELECT state FROM cyclone_tasks WHERE run_id = $1", head.id
    )
    assert state == "failed"  # the sequence stays blocked


async def test_a_nul_in_an_error_is_recorded(cyclone_env: CycloneEnv) -> None:
    probe.reset()
    run = await seq_step.enqueue(cyclone_env.client, "fail")
    await cyclone_env.drain(steps=[seq_step])  # no lease expiry needed to record it
    info = await run.info()
    assert info.state is cyclone.RunState.FAILED
    assert info.nodes[0].errors[0]["message"] == "fails\ufffdwith a NUL"


@cyclone.step("rr.doomed", max_attempts=1)
async def doomed(ctx: cyclone.Context, n: int) -> int:
    raise RuntimeError("this branch fails")


@cyclone.step("rr.late", max_attempts=3)
async def late(ctx: cyclone.Context, n: int) -> int:
    probe.calls.append(ctx.attempt)
    if ctx.attempt == 1:
        await probe.stopped.wait()  # until the run has failed
        raise RuntimeError("fails after the run failed")
    return n


branches = cyclone.define("rr.branches", int)
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


@cyclone.step("rr.child")
async def child(ctx: cyclone.Context, n: int) -> int:
    return n


shaped = cyclone.define("rr.shaped", str)
shaped.node(child, input=lambda text, outputs: len(text))


async def test_nodes_go_only_to_workers_that_know_their_workflow(cyclone_env: CycloneEnv) -> None:
    run = await shaped.submit(cyclone_env.client, "abc")
    async with fast_worker(cyclone_env.client, steps=[child]) as worker:
        await asyncio.wait_for(worker.drain(), 30)
    assert await run.status() is cyclone.RunState.PENDING  # it could not build the input
    async with fast_worker(cyclone_env.client, workflows=[shaped]):
        assert await run.wait(timeout=30) is cyclone.RunState.COMPLETED


async def test_cancelling_a_job_keeps_its_attempts(cyclone_env: CycloneEnv) -> None:
    run = await seq_step.enqueue(cyclone_env.client, "x")
    await cyclone_env.pool.execute(
        """UPDATE cyclone_tasks SET attempt = 2, errors = '[{"attempt": 1}]'"""
    )
    assert await run.cancel()
    node = (await run.info()).nodes[0]
    assert (node.state, node.attempts, node.errors) == ("cancelled", 2, [{"attempt": 1}])


@cyclone.step("rr.quick", max_attempts=1)
async def quick(ctx: cyclone.Context, n: int) -> int:
    return n


@cyclone.step("rr.patient", max_attempts=3)
async def patient(ctx: cyclone.Context, n: int) -> int:
    return n


pair = cyclone.define("rr.pair", int)
pair.node(quick)
pair.node(patient)


async def failed_while_patient_runs(env: CycloneEnv) -> tuple[cyclone.Run, asyncpg.Record]:
    """A run of ``pair`` failed by its quick node's last attempt while its patient node runs;
    the patient node's claimed task."""
    q = env.client.queries
    run = await pair.submit(env.client, 1)
    async with env.pool.acquire() as conn:
        rows = await db.task_claim(
            conn, q, "default", ["rr.quick", "rr.patient"], 2, 30.0, "w", ["rr.pair"]
        )
        first = next(r for r in rows if r["kind"] == "rr.quick")
        async with conn.transaction():
            owned, _ = await _transitions.fail_node_or_job(
                conn,
                q,
                task_id=first["id"],
                claims=first["claims"],
                run_id=run.id,
                node="rr.quick",
                error="{}",
                expired_only=False,
            )
        assert owned
    return run, next(r for r in rows if r["kind"] == "rr.patient")


@pytest.mark.parametrize("how", ["retried", "reclaimed"])
async def test_a_failed_runs_node_that_ends_an_attempt_is_parked(
    cyclone_env: CycloneEnv, how: str
) -> None:
    """A node still running when its run failed ends an attempt with attempts left (its
    handler failed, or its lease ran out). The run starts nothing more, so no available task
    may stay behind: it would count as backlog forever and keep the run from being purged.
    The node is parked, and a retry of the run goes on with its attempts."""
    client, q = cyclone_env.client, cyclone_env.client.queries
    run, second = await failed_while_patient_runs(cyclone_env)
    async with cyclone_env.pool.acquire() as conn:
        if how == "retried":
            assert await db.task_retry_many(
                conn, q, [run.id], [second["id"]], [second["claims"]], [0.0], ['{"n": 1}'], [False]
            )
        else:
            await conn.execute("UPDATE cyclone_tasks SET lease_until = now() - interval '1 hour'")
            assert len(await db.task_reclaim(conn, q, 10)) == 1
    assert await run.status() is cyclone.RunState.FAILED
    assert await count_rows(cyclone_env, "cyclone_tasks") == 0
    assert [s for s in await client.stats() if s.available or s.oldest_seconds] == []
    patient_node = next(n for n in (await run.info()).nodes if n.name == "rr.patient")
    assert (patient_node.state, patient_node.attempts, len(patient_node.errors)) == (
        "pending",
        1,
        1,
    )
    await run.retry_all()
    async with cyclone_env.pool.acquire() as conn:
        rows = await db.task_claim(conn, q, "default", ["rr.patient"], 1, 30.0, "w", ["rr.pair"])
    assert [r["attempt"] for r in rows] == [2]  # it goes on where it stopped


async def test_purge_waits_for_running_nodes_and_takes_parked_tasks(
    cyclone_env: CycloneEnv,
) -> None:
    """A failed run stays while a node of it still runs; an available task it kept (a retry
    racing the run's failure can leave one) is deleted with it."""
    client = cyclone_env.client
    run, _ = await failed_while_patient_runs(cyclone_env)
    assert await client.purge_terminal_runs(0) == 0  # rr.patient still runs
    await cyclone_env.pool.execute(
        "UPDATE cyclone_tasks SET state = 'available', lease_until = NULL WHERE run_id = $1",
        run.id,
    )
    assert await client.purge_terminal_runs(0) == 1
    assert await count_rows(cyclone_env, "cyclone_tasks") == 0
