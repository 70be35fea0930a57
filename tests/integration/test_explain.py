"""client.explain(run): each reason made real on the database, as users meet it.

Where a test needs a worker that serves a queue without claiming from it (a run that is
ready, or behind others), it writes that worker's presence row as a worker does: a live row
that claims nothing is what a worker between two polls looks like to every reader.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import os
import uuid

import asyncpg
import pytest

import cyclone
from cyclone import ReasonCode as Code
from cyclone.testing.plugin import CycloneEnv
from tests.conftest import Probe, fast_worker

probe = Probe()
LIVENESS = 1668899693  # the advisory lock class of workers' liveness locks


@pytest.fixture(autouse=True)
def _reset() -> None:
    probe.reset()


@cyclone.step("why.hold", queue="why")
async def hold(ctx: cyclone.Context, n: int) -> int:
    probe.calls.append(ctx.run_id)
    probe.started.set()
    await probe.stopped.wait()
    return n


@cyclone.action("why.noop", queue="why")
async def noop(ctx: cyclone.Context, n: int) -> None:
    probe.calls.append(n)


@cyclone.action("why.fail", queue="why", max_attempts=2)
async def fail(ctx: cyclone.Context, n: int) -> None:
    raise ValueError(f"no {n}")


chain = cyclone.define("why.chain", int)
chain.node(noop, name="second", after=[chain.node(noop, name="first")])

approval = cyclone.define("why.approval", int)
approval.node(noop, after=[approval.wait("approve", timeout=3600)])

kid = cyclone.define("why.kid", int)
kid.node(hold)
parent = cyclone.define("why.parent", int)
parent.child(kid, name="kid", max_attempts=1)


async def explain(env: CycloneEnv, run: cyclone.Run) -> cyclone.Reason:
    """The one reason of a job, or of a run with one open node."""
    explanation = await env.client.explain(run)
    assert explanation.run_id == run.id
    [reason] = explanation.reasons
    return reason


async def present(
    env: CycloneEnv,
    worker: str = "elsewhere-1",
    *,
    kinds: list[str],
    workflows: tuple[str, ...] = (),
    liveness: int | None = None,
) -> None:
    """A live presence row for ``worker``, serving queue ``why``, as a worker writes it."""
    await env.pool.execute(
        "INSERT INTO public.cyclone_workers"
        " (id, host, pid, queues, kinds, workflows, expires_at, liveness)"
        " VALUES ($1, 'elsewhere', 4242, '{why}', $2, $3, now() + interval '1 hour', $4)",
        worker,
        kinds,
        list(workflows),
        liveness,
    )


async def claimed_by(env: CycloneEnv, run: cyclone.Run, worker: str, lease: dt.timedelta) -> None:
    """The run's task running under ``worker``, its lease ending ``lease`` from now."""
    await env.pool.execute(
        "UPDATE public.cyclone_tasks SET state = 'running', worker = $2, claims = 1,"
        " attempt = 1, started_at = now(), lease_until = now() + $3"
        " WHERE run_id = $1",
        run.id,
        worker,
        lease,
    )


async def test_a_run_scheduled_for_later(cyclone_env: CycloneEnv) -> None:
    run = await noop.enqueue(cyclone_env.client, 1, process_in=3600)
    reason = await explain(cyclone_env, run)
    assert reason.code is Code.SCHEDULED and reason.node == "why.noop"
    assert reason.queue == "why" and reason.until is not None
    assert reason.until > dt.datetime.now(dt.UTC) + dt.timedelta(minutes=50)
    assert "due at" in reason.message


async def test_a_retry_backing_off(cyclone_env: CycloneEnv) -> None:
    run = await fail.enqueue(cyclone_env.client, 7)
    # Until its retry is written: nothing of it runs, nor is claimable, for an hour.
    await cyclone_env.drain(steps=[fail], backoff=lambda attempt: 3600.0)
    reason = await explain(cyclone_env, run)
    assert reason.code is Code.SCHEDULED and reason.until is not None
    assert reason.until > dt.datetime.now(dt.UTC) + dt.timedelta(minutes=50)
    assert "Attempt 2 of 2" in reason.message and "ValueError: no 7" in reason.message


async def test_a_paused_queue(cyclone_env: CycloneEnv) -> None:
    await cyclone_env.client.queues.pause("why", create=True)
    run = await noop.enqueue(cyclone_env.client, 1)
    reason = await explain(cyclone_env, run)
    assert reason.code is Code.QUEUE_PAUSED and reason.queue == "why"
    assert "client.queues.resume('why')" in reason.message


async def test_no_live_worker_serves_it(cyclone_env: CycloneEnv) -> None:
    run = await noop.enqueue(cyclone_env.client, 1)
    assert (await explain(cyclone_env, run)).code is Code.NO_WORKER
    # A worker of the queue that runs other kinds does not serve it either.
    await present(cyclone_env, kinds=["why.hold"])
    reason = await explain(cyclone_env, run)
    assert reason.code is Code.NO_WORKER and "runs kind 'why.noop'" in reason.message


async def test_ready_and_behind_others(cyclone_env: CycloneEnv) -> None:
    await present(cyclone_env, kinds=["why.noop"])
    first = await noop.enqueue(cyclone_env.client, 1, group="tenant:a")
    second = await noop.enqueue(cyclone_env.client, 2, group="tenant:a")
    other = await noop.enqueue(cyclone_env.client, 3, group="tenant:b")
    assert (await explain(cyclone_env, first)).code is Code.READY
    behind = await explain(cyclone_env, second)
    assert behind.code is Code.BEHIND_OTHERS and behind.ahead == 1
    assert "group key 'tenant:a'" in behind.message
    # Keys take turns: another key's first task is not behind the first key's.
    assert (await explain(cyclone_env, other)).code is Code.READY


async def test_a_full_concurrency_limit_names_who_holds_it(cyclone_env: CycloneEnv) -> None:
    await cyclone_env.client.queues.set_limits("why", concurrency=1, create=True)
    holder = await hold.enqueue(cyclone_env.client, 1)
    async with fast_worker(cyclone_env.client, steps=[hold]):
        await asyncio.wait_for(probe.started.wait(), 30)
        waiting = await hold.enqueue(cyclone_env.client, 2)
        reason = await explain(cyclone_env, waiting)
        probe.stopped.set()
    assert reason.code is Code.CONCURRENCY_LIMIT
    assert reason.limit == cyclone.LimitReached("queue", "why", 1)
    assert reason.held_by == (holder.id,) and str(holder.id) in reason.message


async def test_a_full_kind_concurrency_limit(cyclone_env: CycloneEnv) -> None:
    await cyclone_env.client.queues.set_kind_limits("why.hold", concurrency=1)
    holder = await hold.enqueue(cyclone_env.client, 1)
    async with fast_worker(cyclone_env.client, steps=[hold]):
        await asyncio.wait_for(probe.started.wait(), 30)
        reason = await explain(cyclone_env, await hold.enqueue(cyclone_env.client, 2))
        probe.stopped.set()
    assert reason.code is Code.CONCURRENCY_LIMIT and reason.held_by == (holder.id,)
    assert reason.limit == cyclone.LimitReached("kind", "why.hold", 1)


async def test_a_spent_rate_limit_says_when_it_frees(cyclone_env: CycloneEnv) -> None:
    # A new rate starts with an empty bucket: one start an hour, the first an hour away.
    await cyclone_env.client.queues.set_limits("why", rate=1, per=3600, create=True)
    await present(cyclone_env, kinds=["why.noop"])
    reason = await explain(cyclone_env, await noop.enqueue(cyclone_env.client, 1))
    assert reason.code is Code.RATE_LIMIT
    assert reason.limit == cyclone.LimitReached("queue", "why", 1, 3600.0)
    assert reason.until is not None
    assert reason.until > dt.datetime.now(dt.UTC) + dt.timedelta(minutes=50)


async def test_a_group_key_at_its_rate(cyclone_env: CycloneEnv) -> None:
    await cyclone_env.client.queues.set_limits("why", key_rate=1, key_per=3600, create=True)
    await noop.enqueue(cyclone_env.client, 1, group="tenant:a")
    await cyclone_env.drain(steps=[noop])  # one start of tenant:a in the window
    await present(cyclone_env, kinds=["why.noop"])
    reason = await explain(cyclone_env, await noop.enqueue(cyclone_env.client, 2, group="tenant:a"))
    assert reason.code is Code.RATE_LIMIT
    assert reason.limit == cyclone.LimitReached("group", "tenant:a", 1, 3600.0)
    assert reason.until is not None
    assert reason.until > dt.datetime.now(dt.UTC) + dt.timedelta(minutes=50)


async def test_a_sequence_waits_for_its_earlier_run(cyclone_env: CycloneEnv) -> None:
    await present(cyclone_env, kinds=["why.noop"])
    first = await noop.enqueue(cyclone_env.client, 1, sequence="s")
    second = await noop.enqueue(cyclone_env.client, 2, sequence="s")
    reason = await explain(cyclone_env, second)
    assert reason.code is Code.SEQUENCE_BLOCKED and reason.held_by == (first.id,)
    assert (await explain(cyclone_env, first)).code is Code.READY


async def test_a_node_waits_on_its_parents(cyclone_env: CycloneEnv) -> None:
    run = await chain.submit(cyclone_env.client, 1)
    explanation = await cyclone_env.client.explain(run.id)  # a run id does as well
    first, second = explanation.reasons
    assert first.node == "first" and first.code is Code.NO_WORKER
    assert "workflow 'why.chain'" in first.message
    assert second.node == "second" and second.code is Code.WAITING_ON_PARENTS
    assert second.parents == ("first",)


async def test_a_wait_node_waits_for_its_signal(cyclone_env: CycloneEnv) -> None:
    run = await approval.submit(cyclone_env.client, 1)
    created = (await run.info()).created_at
    waiting, after = (await cyclone_env.client.explain(run)).reasons
    assert waiting.node == "approve" and waiting.code is Code.WAITING_FOR_SIGNAL
    assert waiting.since == created and waiting.until is not None
    assert waiting.until - created >= dt.timedelta(minutes=59)
    assert "client.signal(run_id, 'approve', payload)" in waiting.message
    assert after.code is Code.WAITING_ON_PARENTS and after.parents == ("approve",)


async def test_a_child_node_waits_on_its_child_run(cyclone_env: CycloneEnv) -> None:
    run = await parent.submit(cyclone_env.client, 1)
    async with fast_worker(cyclone_env.client, workflows=[parent]) as worker:
        await asyncio.wait_for(probe.started.wait(), 30)
        [child_id] = probe.calls
        reason = await explain(cyclone_env, run)
        child = await explain(cyclone_env, cyclone.Run(cyclone_env.client, child_id))
        probe.stopped.set()
    assert reason.node == "kid" and reason.code is Code.WAITING_ON_CHILD_RUN
    assert reason.child_run == child_id
    assert child.code is Code.RUNNING_ALIVE and child.worker == worker.id


async def test_held_by_a_live_worker(cyclone_env: CycloneEnv) -> None:
    run = await hold.enqueue(cyclone_env.client, 1)
    async with fast_worker(cyclone_env.client, steps=[hold]) as worker:
        await asyncio.wait_for(probe.started.wait(), 30)
        reason = await explain(cyclone_env, run)
        lease = await cyclone_env.pool.fetchval(
            "SELECT lease_until FROM public.cyclone_tasks WHERE run_id = $1", run.id
        )
        probe.stopped.set()
    assert reason.code is Code.RUNNING_ALIVE and reason.worker == worker.id
    assert reason.presence is not None and reason.presence.pid == os.getpid()
    assert reason.until == lease and worker.id in reason.message


async def test_held_by_a_dead_worker(cyclone_env: CycloneEnv) -> None:
    """A worker whose liveness session ended (its lock free), then one whose presence row
    is gone: both lost, released by their peers or at the end of the lease."""
    run = await hold.enqueue(cyclone_env.client, 1)
    holder = await asyncpg.connect(cyclone_env.dsn)
    try:
        assert await holder.fetchval("SELECT pg_try_advisory_lock($1, 77)", LIVENESS)
        await present(cyclone_env, "ghost", kinds=["why.hold"], liveness=77)
        await claimed_by(cyclone_env, run, "ghost", dt.timedelta(hours=1))
        assert (await explain(cyclone_env, run)).code is Code.RUNNING_ALIVE
    finally:
        await holder.close()
    async with asyncio.timeout(30):  # the server ends the session, and frees its lock
        while await cyclone_env.pool.fetchval(  # noqa: ASYNC110 - another session's state
            "SELECT count(*) > 0 FROM pg_locks WHERE locktype = 'advisory'"
            " AND classid = $1 AND objid = 77 AND granted",
            LIVENESS,
        ):
            await asyncio.sleep(0.01)
    lost = await explain(cyclone_env, run)
    assert lost.code is Code.RUNNING_WORKER_LOST and lost.worker == "ghost"
    assert lost.presence is not None and lost.presence.host == "elsewhere"
    assert lost.until is not None and "liveness lock is free" in lost.message
    await cyclone_env.pool.execute("DELETE FROM public.cyclone_workers WHERE id = 'ghost'")
    gone = await explain(cyclone_env, run)
    assert gone.code is Code.RUNNING_WORKER_LOST and gone.presence is None
    lease = await cyclone_env.pool.fetchval(
        "SELECT lease_until FROM public.cyclone_tasks WHERE run_id = $1", run.id
    )
    assert gone.until == lease


async def test_a_lease_that_ran_out(cyclone_env: CycloneEnv) -> None:
    run = await hold.enqueue(cyclone_env.client, 1)
    await present(cyclone_env, "stalled", kinds=["why.hold"])
    await claimed_by(cyclone_env, run, "stalled", -dt.timedelta(minutes=1))
    reason = await explain(cyclone_env, run)
    assert reason.code is Code.LEASE_EXPIRED and reason.worker == "stalled"
    assert "maintenance" in reason.message


async def test_a_run_that_ended(cyclone_env: CycloneEnv) -> None:
    done = await noop.enqueue(cyclone_env.client, 1)
    failed = await fail.enqueue(cyclone_env.client, 2, max_attempts=1)
    cancelled = await noop.enqueue(cyclone_env.client, 3, process_in=3600)
    await cancelled.cancel()
    await cyclone_env.drain(steps=[noop, fail])
    for run, code in ((done, Code.COMPLETED), (failed, Code.FAILED), (cancelled, Code.CANCELLED)):
        explanation = await cyclone_env.client.explain(run)
        assert explanation.state.value == code.value
        [reason] = explanation.reasons
        assert reason.code is code and reason.node is None
    assert "ValueError: no 2" in (await explain(cyclone_env, failed)).message


async def test_an_unknown_run_and_bad_input(cyclone_env: CycloneEnv) -> None:
    with pytest.raises(cyclone.RunNotFoundError):
        await cyclone_env.client.explain(uuid.uuid4())
    with pytest.raises(cyclone.InvalidInputError, match=r"uuid\.UUID"):
        await cyclone_env.client.explain(str(uuid.uuid4()))  # type: ignore[arg-type]


# Finished runs of why.chain: a run, its two completed steps and the edge between them each.
_HISTORY = """
WITH r AS (
    INSERT INTO public.cyclone_runs
        (id, name, job, state, input, nodes, remaining, created_at, finished_at)
    SELECT gen_random_uuid(), 'why.chain', false, 'completed', to_jsonb(g.i), 2, 0, now(), now()
    FROM generate_series(1, $1::int) AS g (i)
    RETURNING id
), s AS (
    INSERT INTO public.cyclone_steps
        (run_id, node, kind, queue, priority, max_attempts, state, pending_deps, attempts,
         output, finished_at)
    SELECT r.id, n.node, 'why.noop', 'why', 0, 1, 'completed', 0, 1, 'null', now()
    FROM r, (VALUES ('first'), ('second')) AS n (node)
)
INSERT INTO public.cyclone_edges (run_id, parent, child) SELECT r.id, 'first', 'second' FROM r
"""


def _seq_scans(plan: object) -> set[str]:
    """The tables a plan reads in full (the few rows of flow control and workers may be)."""
    if isinstance(plan, list):
        return set().union(*map(_seq_scans, plan)) if plan else set()
    if not isinstance(plan, dict):
        return set()
    found = {plan["Relation Name"]} if plan.get("Node Type") == "Seq Scan" else set()
    return found.union(*map(_seq_scans, plan.values()))


async def test_explaining_reads_by_key_behind_a_long_backlog(cyclone_env: CycloneEnv) -> None:
    """Safe to call in a loop: with a long history analyzed before a backlog that no ANALYZE
    has seen, node_explain reads runs, steps, edges and tasks by key, and counts at most
    1000 tasks ahead of a node however long the backlog before it."""
    pool = cyclone_env.pool
    for table in ("cyclone_runs", "cyclone_tasks", "cyclone_steps", "cyclone_edges"):
        await pool.execute(f"ALTER TABLE public.{table} SET (autovacuum_enabled = false)")
    await pool.execute(_HISTORY, 20_000)
    await pool.execute("VACUUM ANALYZE")
    jobs = await noop.enqueue_many(cyclone_env.client, list(range(3_000)))
    flow = await chain.submit(cyclone_env.client, 1)
    await present(cyclone_env, kinds=["why.noop"], workflows=("why.chain",))
    last = await explain(cyclone_env, jobs[-1])
    assert last.code is Code.BEHIND_OTHERS and last.ahead == 1000
    assert "1000 other claimable tasks or more" in last.message
    sql = cyclone_env.client._queries["node_explain"]
    async with pool.acquire() as conn:
        for mode in ("custom", "generic"):
            await conn.execute(f"SET plan_cache_mode = force_{mode}_plan")
            statement = await conn.prepare(f"EXPLAIN (FORMAT JSON) {sql}")
            for run in (jobs[-1], flow):
                plan = json.loads(await statement.fetchval(run.id, 100))
                large = {"cyclone_runs", "cyclone_steps", "cyclone_edges", "cyclone_tasks"}
                assert _seq_scans(plan) & large == set(), (mode, run, plan)
