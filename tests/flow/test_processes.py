"""Flow control holds across 4 worker processes: a global limit (also across a SIGKILL), a
rate limit, pause and resume, and fair turns across group keys."""

from __future__ import annotations

import asyncio
import datetime as dt
import signal

import cyclone
from cyclone._worker.producer import CLAIMS_AT_ONCE
from cyclone.testing.plugin import CycloneEnv
from tests.flow.conftest import make_starts_table, until, worker_processes
from tests.flow.flow_app import Work, work

POLL = 0.2  # flow_app's poll interval


async def done(env: CycloneEnv, n: int) -> bool:
    count: int = await env.pool.fetchval(
        "SELECT count(*) FROM cyclone_runs WHERE state = 'completed'"
    )
    return count >= n


async def test_a_global_limit_of_3_holds_across_4_workers_and_a_sigkill(
    cyclone_env: CycloneEnv,
) -> None:
    env, client = cyclone_env, cyclone_env.client
    await make_starts_table(env)
    await client.queues.set_limits("flow", concurrency=3, create=True)
    await work.enqueue_many(client, [Work("a", 150) for _ in range(60)])
    samples: list[int] = []
    stop = asyncio.Event()

    async def sample() -> None:  # from a connection of its own, every 10 ms, all along
        async with env.pool.acquire() as conn:
            while not stop.is_set():
                samples.append(
                    await conn.fetchval(
                        "SELECT count(*) FROM cyclone_tasks"
                        " WHERE queue = 'flow' AND state = 'running'"
                    )
                )
                await asyncio.sleep(0.01)

    sampler = asyncio.get_running_loop().create_task(sample())
    try:
        async with worker_processes(env, 4) as procs:

            async def holding() -> bool:  # a worker holds a slot mid-run: kill that one
                return await env.pool.fetchval("SELECT count(*) FROM flow_starts") >= 10

            await until(holding)
            worker = await env.pool.fetchval(
                "SELECT worker FROM cyclone_tasks WHERE state = 'running' LIMIT 1"
            )
            pid = int(worker.split(":")[1])
            victim = next(p for p in procs if p.pid == pid)
            victim.send_signal(signal.SIGKILL)
            assert await victim.wait() == -signal.SIGKILL
            # What it held when it died (its attempt may have ended just before the kill):
            # those tasks stay running, and count against the limit, until a peer finds the
            # worker lost (or, without its liveness lock, until their lease expires).
            held = await env.pool.fetchval(
                "SELECT count(*) FROM cyclone_tasks WHERE worker = $1 AND state = 'running'",
                worker,
            )
            await until(lambda: done(env, 60), timeout=180)
    finally:
        stop.set()
        await sampler
    assert len(samples) > 100
    assert max(samples) <= 3, max(samples)
    assert 3 in samples  # the limit was reached, not just undershot
    # The killed worker's attempt counted until it was found lost, then went back.
    lost = await env.pool.fetchval(
        "SELECT count(*) FROM cyclone_runs r, jsonb_array_elements(r.errors) e"
        " WHERE e ->> 'type' IN ('WorkerLost', 'LeaseExpired')"
    )
    assert lost >= held


async def test_a_rate_of_20_per_second_holds_within_10_percent_over_10_seconds(
    cyclone_env: CycloneEnv,
) -> None:
    env, client = cyclone_env, cyclone_env.client
    await make_starts_table(env)
    await client.queues.pause("flow", create=True)
    await work.enqueue_many(client, [Work("a", 0) for _ in range(300)])
    async with worker_processes(env, 4):
        await client.queues.set_limits("flow", rate=20, per=1.0)  # an empty bucket
        await client.queues.resume("flow")

        async def ten_seconds() -> bool:
            span = await env.pool.fetchval("SELECT max(at) - min(at) FROM flow_starts")
            return span is not None and span >= dt.timedelta(seconds=10.5)

        await until(ten_seconds, timeout=180)
    starts = await env.pool.fetchval(
        "SELECT count(*) FROM flow_starts"
        " WHERE at < (SELECT min(at) FROM flow_starts) + interval '10 seconds'"
    )
    assert 180 <= starts <= 220, starts
    # No attempt was spent waiting for a token.
    assert await env.pool.fetchval("SELECT max(attempts) FROM cyclone_runs") <= 1


async def test_pause_stops_new_starts_and_resume_restarts_them(cyclone_env: CycloneEnv) -> None:
    env, client = cyclone_env, cyclone_env.client
    await make_starts_table(env)
    await work.enqueue_many(client, [Work("a", 50) for _ in range(2_000)])
    async with worker_processes(env, 4):

        async def some() -> bool:
            return await env.pool.fetchval("SELECT count(*) FROM flow_starts") >= 50

        await until(some)
        assert await client.queues.pause("flow") is True
        paused_at = await env.pool.fetchval("SELECT clock_timestamp()")

        async def drained() -> bool:  # the work running at the pause finishes
            running = await env.pool.fetchval(
                "SELECT count(*) FROM cyclone_tasks WHERE state = 'running'"
            )
            return running == 0

        await until(drained)
        await asyncio.sleep(5 * POLL)  # five polls of every worker: none may claim
        before = await env.pool.fetchval("SELECT count(*) FROM flow_starts")
        # Every claim that began after the pause committed started nothing.
        late = await env.pool.fetchval(
            "SELECT count(*) FROM flow_starts WHERE claimed_at > $1", paused_at
        )
        assert late == 0
        stats = {s.queue: s for s in await client.stats()}
        assert stats["flow"].paused and stats["flow"].available > 0
        assert await client.queues.resume("flow") is True
        resumed_at = await env.pool.fetchval("SELECT clock_timestamp()")

        async def restarted() -> bool:
            count: int = await env.pool.fetchval("SELECT count(*) FROM flow_starts")
            return count > before

        await until(restarted)
        first = await env.pool.fetchval(
            "SELECT min(claimed_at) FROM flow_starts WHERE claimed_at > $1", paused_at
        )
        assert first >= resumed_at - dt.timedelta(seconds=1)


async def test_a_quiet_tenant_starts_in_the_first_claim_behind_a_backlog(
    cyclone_env: CycloneEnv,
) -> None:
    env, client = cyclone_env, cyclone_env.client
    await make_starts_table(env)
    await work.enqueue_many(client, [Work("a", 0) for _ in range(20_000)], group="a")
    (b,) = await work.enqueue_many(client, [Work("b", 0)], group="b")
    async with worker_processes(env, 4):

        async def b_started() -> bool:
            return bool(
                await env.pool.fetchval("SELECT count(*) FROM flow_starts WHERE tenant = 'b'")
            )

        await until(b_started)
        # Before the workers are killed: its outcome may still wait to be written.
        assert await b.wait(timeout=60) is cyclone.RunState.COMPLETED
    # B's job was taken by the first claim statement to run. A claim's clock reads when its
    # transaction began, so claims that began earlier were still running beside it: at most
    # CLAIMS_AT_ONCE from each worker, less b's own. Behind a FIFO backlog it would be thousands.
    b_claim = await env.pool.fetchval("SELECT claimed_at FROM flow_starts WHERE tenant = 'b'")
    earlier = await env.pool.fetchval(
        "SELECT count(DISTINCT claimed_at) FROM flow_starts WHERE claimed_at < $1", b_claim
    )
    assert earlier < 4 * CLAIMS_AT_ONCE


async def test_a_per_key_rate_holds_per_tenant_and_spares_a_quiet_one(
    cyclone_env: CycloneEnv,
) -> None:
    env, client = cyclone_env, cyclone_env.client
    await make_starts_table(env)
    await client.queues.pause("flow", create=True)
    await client.queues.set_limits("flow", key_rate=10, key_per=1.0)
    for tenant in ("a", "b"):
        await work.enqueue_many(client, [Work(tenant, 0) for _ in range(200)], group=tenant)
    async with worker_processes(env, 4):
        await client.queues.resume("flow")

        async def spent() -> bool:  # a and b have used up their first windows
            return await env.pool.fetchval("SELECT count(*) FROM flow_starts") >= 20

        await until(spent)
        (c,) = await work.enqueue_many(client, [Work("c", 0)], group="c")
        assert await c.wait(timeout=60) is cyclone.RunState.COMPLETED

        async def five_seconds() -> bool:
            span = await env.pool.fetchval(
                "SELECT max(claimed_at) - min(claimed_at) FROM flow_starts"
            )
            return span is not None and span >= dt.timedelta(seconds=5.5)

        await until(five_seconds, timeout=180)
    # By the claims' clock: each tenant's starts in the 5 seconds from its first.
    counts = dict(
        await env.pool.fetch(
            "SELECT s.tenant, count(*) FROM flow_starts s"
            " WHERE s.claimed_at < (SELECT min(f.claimed_at) FROM flow_starts f"
            "                       WHERE f.tenant = s.tenant) + interval '5 seconds'"
            " GROUP BY s.tenant"
        )
    )
    assert 45 <= counts["a"] <= 55 and 45 <= counts["b"] <= 55, counts
    # No key ever started more than 10 in any second (a start, and the 10 after it).
    worst = await env.pool.fetchval(
        "SELECT max(n) FROM (SELECT count(*) OVER (PARTITION BY tenant ORDER BY claimed_at"
        " RANGE BETWEEN CURRENT ROW AND interval '999 milliseconds' FOLLOWING) AS n"
        " FROM flow_starts) w"
    )
    assert worst <= 10, worst
    # The quiet tenant's job did not wait for a's and b's windows: no start of theirs that
    # came after it was enqueued was claimed before it.
    enqueued, c_claim = await env.pool.fetchrow(
        "SELECT r.created_at, s.claimed_at FROM cyclone_runs r JOIN flow_starts s"
        " ON s.run_id = r.id WHERE s.tenant = 'c'"
    )
    first_after = await env.pool.fetchval(
        "SELECT min(claimed_at) FROM flow_starts WHERE tenant <> 'c' AND claimed_at > $1",
        enqueued,
    )
    assert first_after is not None and c_claim <= first_after
    assert await env.pool.fetchval("SELECT max(attempts) FROM cyclone_runs") <= 1
