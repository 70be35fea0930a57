"""Job expiry: a job not started by its expires_at never runs and ends expired, whether a
claim meets it first (it skips it) or nobody claims (the maintenance sweep ends it); a job
that started does not expire; the unique key is freed; a claim and the sweep racing for
one task end it exactly once."""

from __future__ import annotations

import asyncio
import datetime as dt

import pytest

import cyclone
from cyclone._storage import queries as db
from cyclone._storage.loader import Queries
from cyclone.testing.plugin import CycloneEnv
from tests.conftest import count_rows

CALLS: list[int] = []
MOVABLE = (
    "now() + coalesce(nullif(current_setting('cyclone.test_offset', true), ''), '0s')::interval"
)


@cyclone.step("expiry.work", queue="expiry", max_attempts=3)
async def work(ctx: cyclone.Context, n: int) -> int:
    CALLS.append(n)
    return n


@cyclone.step("expiry.flaky", queue="expiry", max_attempts=3)
async def flaky(ctx: cyclone.Context, n: int) -> int:
    CALLS.append(n)
    if ctx.attempt == 1:
        raise RuntimeError("first attempt fails")
    return n


@cyclone.step("expiry.slow", queue="expiry")
async def slow(ctx: cyclone.Context, n: int) -> None:
    CALLS.append(n)
    await asyncio.sleep(0.005)


@pytest.fixture(autouse=True)
def _calls() -> None:
    CALLS.clear()


def _past() -> dt.datetime:
    return dt.datetime.now(dt.UTC) - dt.timedelta(seconds=1)


def _claim(limit: int = 10) -> db.ClaimRequest:
    return db.ClaimRequest("expiry", [work.name, flaky.name], limit, 30.0, "w", [])


async def test_a_claim_skips_an_expired_job_and_the_sweep_ends_it(cyclone_env: CycloneEnv) -> None:
    client, q = cyclone_env.client, cyclone_env.client._queries
    late = await work.enqueue(client, 1, expires_at=_past())
    async with cyclone_env.pool.acquire() as conn:
        assert await db.task_claim(conn, q, _claim()) == []
        assert await db.task_claim_plain(conn, q, _claim()) == []
        assert not await db.task_pending_work(conn, q, [work.name], [])
        fresh = await work.enqueue(client, 2, expires_in=dt.timedelta(hours=1))
        claimed = await db.task_claim_plain(conn, q, _claim())
        assert [r["run_id"] for r in claimed] == [fresh.id]  # the expired one is passed by
        # The claim cleared the started job's expiry; the expired one waits for the sweep.
        expiries = await conn.fetch("SELECT run_id, expires_at FROM cyclone_tasks ORDER BY id")
        assert [(r["run_id"], r["expires_at"] is None) for r in expiries] == [
            (late.id, False),
            (fresh.id, True),
        ]
        (ended,) = await db.job_expire(conn, q, 100)
        assert (ended["run_id"], ended["kind"]) == (late.id, work.name)
        assert await db.job_expire(conn, q, 100) == []
    assert await late.status() is cyclone.RunState.EXPIRED
    assert await late.wait(timeout=10) is cyclone.RunState.EXPIRED
    with pytest.raises(cyclone.RunExpiredError, match="expired before a worker started it"):
        await late.result(timeout=10)
    info = await late.info()
    assert info.finished_at is not None and [n.state for n in info.nodes] == ["expired"]
    assert (await client.explain(late.id)).reasons[0].code is cyclone.ReasonCode.EXPIRED
    page = await client.list_runs(cyclone.RunQuery(state=cyclone.RunState.EXPIRED))
    assert [r.id for r in page.runs] == [late.id]
    assert await count_rows(cyclone_env, "cyclone_tasks", f"run_id = '{late.id}'") == 0


async def test_the_worker_never_runs_an_expired_job(cyclone_env: CycloneEnv) -> None:
    client = cyclone_env.client
    expired = await work.enqueue_many(client, [1, 2, 3], expires_at=_past())
    kept = await work.enqueue(client, 4, expires_in=3600)
    async with cyclone_env.worker(steps=[work]):
        states = [await r.wait(timeout=30) for r in [*expired, kept]]
    assert states == [cyclone.RunState.EXPIRED] * 3 + [cyclone.RunState.COMPLETED]
    assert CALLS == [4]


async def test_the_sweep_ends_expired_jobs_of_a_paused_queue(cyclone_env: CycloneEnv) -> None:
    client = cyclone_env.client
    await client.queues.pause("expiry", create=True)
    runs = await work.enqueue_many(client, list(range(5)), expires_in=0.2)
    waiting = await work.enqueue(client, 9, expires_in=3600)
    async with cyclone_env.worker(steps=[work]):
        for run in runs:
            assert await run.wait(timeout=30) is cyclone.RunState.EXPIRED
        assert await waiting.status() is cyclone.RunState.PENDING
    assert CALLS == []


async def test_expiry_applies_only_until_a_job_starts(cyclone_env: CycloneEnv) -> None:
    """A job whose first attempt fails waits for its retry past its expiry: it still runs."""
    client, q = cyclone_env.client, Queries(cyclone_env.client._queries.schema, clock=MOVABLE)
    run = await flaky.enqueue(client, 7, expires_in=60)
    async with cyclone_env.pool.acquire() as conn:
        (task,) = await db.task_claim(conn, q, _claim())
        fence = db.Fence([run.id], [task["id"]], [task["claims"]])
        error = '{"type": "RuntimeError", "message": "first attempt fails"}'
        assert await db.task_retry_many(conn, q, fence, [90.0], [error], [False])
        await conn.execute("SET cyclone.test_offset = '2 minutes'")
        assert await db.job_expire(conn, q, 100) == []
        (again,) = await db.task_claim(conn, q, _claim())
        assert (again["run_id"], again["attempt"]) == (run.id, 2)
    assert await run.status() is cyclone.RunState.RUNNING


async def test_an_expired_job_frees_its_unique_key(cyclone_env: CycloneEnv) -> None:
    client, q = cyclone_env.client, cyclone_env.client._queries
    first = await work.enqueue(client, 1, unique="k", expires_at=_past())
    with pytest.raises(cyclone.DuplicateError):
        await work.enqueue(client, 2, unique="k")
    async with cyclone_env.pool.acquire() as conn:
        assert len(await db.job_expire(conn, q, 100)) == 1
    assert await first.status() is cyclone.RunState.EXPIRED
    second = await work.enqueue(client, 2, unique="k")
    assert second.id != first.id


async def test_a_sequence_moves_on_past_an_expired_job(cyclone_env: CycloneEnv) -> None:
    client = cyclone_env.client
    head = await work.enqueue(client, 1, sequence="s", expires_at=_past())
    after = await work.enqueue(client, 2, sequence="s")
    async with cyclone_env.worker(steps=[work]):
        assert await after.wait(timeout=30) is cyclone.RunState.COMPLETED
    assert await head.status() is cyclone.RunState.EXPIRED
    assert CALLS == [2]


async def test_a_claim_and_the_sweep_end_each_task_once(cyclone_env: CycloneEnv) -> None:
    """Both lock the task with SKIP LOCKED and read its expiry again under the lock: each
    job either runs once (completed) or expires without running, never both."""
    client = cyclone_env.client
    n = 300
    sweeping = True

    async def sweep() -> int:
        ended = 0
        async with cyclone_env.pool.acquire() as conn:
            while sweeping:
                ended += len(await db.job_expire(conn, client._queries, 5))
                await asyncio.sleep(0)
        return ended

    sweeper = asyncio.create_task(sweep())
    async with cyclone_env.worker(steps=[slow], queues={"expiry": 2}):
        # Slow enough that the expiry passes part way through the backlog.
        runs = await slow.enqueue_many(client, list(range(n)), expires_in=0.5)
        states = [await r.wait(timeout=60) for r in runs]
    sweeping = False
    await sweeper
    done = [i for i, s in enumerate(states) if s is cyclone.RunState.COMPLETED]
    expired = [i for i, s in enumerate(states) if s is cyclone.RunState.EXPIRED]
    assert done and expired  # the race happened: some of each
    assert sorted(done + expired) == list(range(n))
    assert sorted(CALLS) == done  # each completed job ran once, no expired one ran
    assert await count_rows(cyclone_env, "cyclone_tasks") == 0


async def test_bad_expiry_options_are_refused_before_any_write(cyclone_env: CycloneEnv) -> None:
    client = cyclone_env.client
    soon = dt.datetime.now(dt.UTC) + dt.timedelta(minutes=1)
    with pytest.raises(cyclone.InvalidInputError, match="expires_at or expires_in, not both"):
        await work.enqueue(client, 1, expires_at=soon, expires_in=60)
    with pytest.raises(cyclone.InvalidInputError, match="timezone-aware"):
        await work.enqueue(client, 1, expires_at=dt.datetime.now())
    with pytest.raises(cyclone.InvalidInputError, match="before it is due"):
        await work.enqueue(client, 1, process_in=120, expires_in=60)
    with pytest.raises(cyclone.InvalidInputError, match="non-negative"):
        await work.enqueue(client, 1, expires_in=-1)
    flow = cyclone.define("expiry.flow", int)
    flow.node(work)
    with pytest.raises(cyclone.InvalidInputError, match="standalone jobs only"):
        await flow.submit(client, 1, expires_in=60)  # type: ignore[call-arg]
    assert await count_rows(cyclone_env, "cyclone_runs") == 0
