"""The plain claim (``task_claim_plain``): what ``task_claim`` would claim from a queue that
uses no flow control, more cheaply; for a queue that does, nothing, and a word to use
``task_claim``. A worker claims by it while it can."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

import cyclone
from cyclone._storage import queries as db
from cyclone.testing.plugin import CycloneEnv
from tests.conftest import Probe, fast_worker

probe = Probe()


@cyclone.step("plain.noop", queue="plain")
async def noop(ctx: cyclone.Context, n: int) -> int:
    probe.calls.append(n)
    return n


@cyclone.step("plain.other", queue="plain")
async def other(ctx: cyclone.Context, n: int) -> int:
    return n


@pytest.fixture
def env(cyclone_env: CycloneEnv) -> CycloneEnv:
    probe.reset()
    return cyclone_env


async def claim_plain(env: CycloneEnv, limit: int, kinds: list[str]) -> db.ClaimedRows:
    async with env.pool.acquire() as conn:
        return await db.task_claim_plain(
            conn, env.client._queries, db.ClaimRequest("plain", kinds, limit, 30.0, "w", [])
        )


async def available(env: CycloneEnv) -> int:
    n: int = await env.pool.fetchval("SELECT count(*) FROM cyclone_tasks WHERE state = 'available'")
    return n


async def test_it_claims_in_the_order_the_full_claim_would(env: CycloneEnv) -> None:
    """Highest priority first, then the earliest available, then the first enqueued; only
    due tasks of the kinds asked for; at most the limit."""
    client = env.client
    await noop.enqueue_many(client, list(range(6)))
    await noop.enqueue_many(client, [10, 11], priority=5)
    await noop.enqueue_many(client, [20], process_in=3600.0, priority=9)  # not due
    await other.enqueue_many(client, [30], priority=9)  # a kind not asked for
    batches: list[set[int]] = []  # the order within one batch is the UPDATE's, not the claim's
    while rows := await claim_plain(env, 3, [noop.name]):
        assert not rows.declined and len(rows) <= 3
        batches.append({int(r["input"]) for r in rows})
    assert batches == [{10, 11, 0}, {1, 2, 3}, {4, 5}]
    assert await available(env) == 2


async def test_a_sequence_and_a_finished_run_are_respected(env: CycloneEnv) -> None:
    """Only a sequence's first live task, and no task of a run that is no longer pending."""
    client = env.client
    await noop.enqueue_many(client, [1, 2], sequence="s")
    cancelled = await noop.enqueue(client, 3)
    await cancelled.cancel()
    rows = await claim_plain(env, 10, [noop.name])
    assert [int(r["input"]) for r in rows] == [1]


async def claimed_by(env: CycloneEnv, claim: str, limit: int, kinds: list[str]) -> list[int]:
    """The task ids a claim takes, in a transaction rolled back after it."""
    take = db.task_claim if claim == "full" else db.task_claim_plain
    async with env.pool.acquire() as conn:
        tx = conn.transaction()
        await tx.start()
        try:
            request = db.ClaimRequest("plain", kinds, limit, 30.0, "w", [])
            rows = await take(conn, env.client._queries, request)
        finally:
            await tx.rollback()
    assert not rows.held and not rows.declined
    return sorted(r["id"] for r in rows)


@pytest.mark.parametrize("seed", range(4))
async def test_it_takes_the_tasks_the_full_claim_takes(env: CycloneEnv, seed: int) -> None:
    """Mixed backlogs (priorities, tasks not yet due, sequences, cancelled runs, two kinds):
    for every limit and set of kinds, the same tasks as task_claim."""
    rnd = random.Random(seed)
    for i in range(40):
        options: dict[str, Any] = {}
        if rnd.random() < 0.3:
            options["priority"] = rnd.randint(0, 3)
        if rnd.random() < 0.2:
            options["process_in"] = 3600.0
        if rnd.random() < 0.2:
            options["sequence"] = rnd.choice(["s1", "s2"])
        [run] = await rnd.choice([noop, other]).enqueue_many(env.client, [i], **options)
        if rnd.random() < 0.1:
            await run.cancel()
    for limit in (1, 3, 7, 50):
        for kinds in ([noop.name], [noop.name, other.name]):
            full = await claimed_by(env, "full", limit, kinds)
            assert full == await claimed_by(env, "plain", limit, kinds), (limit, kinds)


SETUPS: dict[str, Callable[[cyclone.Client], Awaitable[object]]] = {
    "paused": lambda c: c.queues.pause("plain", create=True),
    "a concurrency limit": lambda c: c.queues.set_limits("plain", concurrency=5, create=True),
    "a rate limit": lambda c: c.queues.set_limits("plain", rate=100, per=1.0, create=True),
    "a key limit": lambda c: c.queues.set_limits("plain", key_concurrency=2, create=True),
    "a key rate": lambda c: c.queues.set_limits("plain", key_rate=2, key_per=1.0, create=True),
    "a limited kind": lambda c: c.queues.set_kind_limits(noop.name, concurrency=5),
    "keyed work": lambda c: noop.enqueue_many(c, [100], group="tenant"),
    # The full claim rotates across the keys, whatever their kind or due time.
    "keyed work of a kind not served": lambda c: other.enqueue_many(c, [100], group="tenant"),
    "keyed work not yet due": lambda c: noop.enqueue_many(
        c, [100], group="tenant", process_in=3600.0
    ),
}


@pytest.mark.parametrize("setup", list(SETUPS))
async def test_a_queue_using_flow_control_is_declined_and_nothing_claimed(
    env: CycloneEnv, setup: str
) -> None:
    await noop.enqueue_many(env.client, list(range(5)))
    await SETUPS[setup](env.client)
    before = await available(env)
    rows = await claim_plain(env, 10, [noop.name])
    assert rows.declined and list(rows) == []
    assert await available(env) == before  # nothing claimed


async def full_claim(env: CycloneEnv, limit: int) -> db.ClaimedRows:
    async with env.pool.acquire() as conn:
        return await db.task_claim(
            conn, env.client._queries, db.ClaimRequest("plain", [noop.name], limit, 30.0, "w", [])
        )


@pytest.mark.parametrize("setup", list(SETUPS))
async def test_the_full_claim_says_whether_flow_control_is_in_use(
    env: CycloneEnv, setup: str
) -> None:
    """task_claim says ``plain`` exactly where task_claim_plain would claim: for a queue
    without flow control, whether it finds work or not; never under any of SETUPS."""
    assert (await full_claim(env, 10)).plain  # nothing to claim: still plain
    await noop.enqueue_many(env.client, list(range(5)))
    assert (await full_claim(env, 2)).plain  # a full claim too
    await SETUPS[setup](env.client)
    assert not (await full_claim(env, 1)).plain


async def test_limits_cleared_or_a_row_without_limits_claim_plainly(env: CycloneEnv) -> None:
    """A queue's row with no limit set, a limited kind the worker does not serve, and keyed
    work of another queue are no flow control of this claim's."""
    client = env.client
    await client.queues.set_limits("plain", concurrency=5, create=True)
    await client.queues.set_limits("plain")  # cleared
    await client.queues.set_kind_limits(other.name, concurrency=1)
    await noop.enqueue_many(client, [7], group="tenant", queue="elsewhere")
    await noop.enqueue_many(client, list(range(5)))
    rows = await claim_plain(env, 10, [noop.name])
    assert not rows.declined and len(rows) == 5


async def last_claims(env: CycloneEnv) -> set[str]:
    """The claim statements that connections held by a worker sent last."""
    rows = await env.pool.fetch(
        "SELECT substring(query from '^-- cyclone: (task_claim\\w*)') AS name"
        " FROM pg_stat_activity WHERE datname = current_database()"
    )
    return {r["name"] for r in rows if r["name"]}


async def until_last_claim(env: CycloneEnv, name: str) -> None:
    async with asyncio.timeout(60):  # the next polls' claims: observed, not slept on
        while name not in await last_claims(env):  # noqa: ASYNC110 - another session's state
            await asyncio.sleep(0.02)


async def test_a_worker_claims_plainly_until_a_limit_is_set_and_then_obeys_it(
    env: CycloneEnv,
) -> None:
    """A worker on an unlimited queue sends the plain claim; once the queue is limited, the
    plain claim declines and the full one claims, within the limit; once the limit is
    cleared, the next full claim says so and the plain claim is back."""
    client = env.client
    async with fast_worker(client, steps=[noop, other], queues={"plain": 8}) as worker:
        await noop.enqueue_many(client, list(range(20)))
        await asyncio.wait_for(worker.drain(), 60)
        assert await last_claims(env) == {"task_claim_plain"}
        await client.queues.pause("plain")
        await noop.enqueue_many(client, list(range(20, 30)))
        await until_last_claim(env, "task_claim")
        assert await available(env) == 10  # paused: nothing started
        await client.queues.set_limits("plain", concurrency=1)
        await client.queues.resume("plain")
        async with asyncio.timeout(60):
            while await available(env):
                running = await env.pool.fetchval(
                    "SELECT count(*) FROM cyclone_tasks WHERE state = 'running'"
                )
                assert running <= 1  # the full claim obeys the limit
                await asyncio.sleep(0.01)
        await asyncio.wait_for(worker.drain(), 60)
        await client.queues.set_limits("plain")  # cleared
        await until_last_claim(env, "task_claim_plain")
    assert sorted(probe.calls) == list(range(30))
