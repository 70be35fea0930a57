"""How soon a worker claims under flow control: a rate limit's next token and a key's
window are claimed for when they come, not at the next poll; once flow control is no longer
in use (a resume, limits cleared), the next claims are the plain claim's."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

import cyclone
from cyclone._storage import queries as db
from cyclone.testing.plugin import CycloneEnv
from tests.conftest import fast_worker


@cyclone.step("pace.tick", queue="paced")
async def tick(ctx: cyclone.Context, n: int) -> int:
    return n


# A poll an hour away: whatever starts within a test's timeout was claimed for by the worker
# itself (a wakeup, a freed slot, a limit's retry time), never by its poll.
NO_POLL = 3600.0


async def completed(env: CycloneEnv) -> int:
    n: int = await env.pool.fetchval("SELECT count(*) FROM cyclone_runs WHERE state = 'completed'")
    return n


async def until_completed(env: CycloneEnv, n: int, timeout: float = 60.0) -> None:
    """Until ``n`` runs completed (their starts paced by the database's limits, which no
    event in this process announces); fail after ``timeout``, far below NO_POLL."""
    async with asyncio.timeout(timeout):
        while await completed(env) < n:  # noqa: ASYNC110 - the worker's progress, in the database
            await asyncio.sleep(0.05)


async def test_a_rate_limited_queue_claims_when_its_next_token_is_due(
    cyclone_env: CycloneEnv,
) -> None:
    """Ten starts a second, the bucket empty when the rate is set: a start each tenth of a
    second, each claim held back by the rate claiming again at its retry time."""
    client = cyclone_env.client
    await client.queues.pause("paced", create=True)
    async with fast_worker(client, steps=[tick], queues={"paced": 10}, poll_interval=NO_POLL):
        await tick.enqueue_many(client, list(range(200)))
        await client.queues.set_limits("paced", rate=10, per=1.0)
        await client.queues.resume("paced")
        await until_completed(cyclone_env, 25)
    assert await completed(cyclone_env) < 200  # the rate held: not the whole backlog at once


async def test_a_key_at_its_rate_claims_when_a_start_leaves_its_window(
    cyclone_env: CycloneEnv,
) -> None:
    """Five starts a second per key: the key's next five start once the first five's
    window has passed, and so on, without a poll."""
    client = cyclone_env.client
    await client.queues.set_limits("paced", key_rate=5, key_per=1.0, create=True)
    async with fast_worker(client, steps=[tick], queues={"paced": 10}, poll_interval=NO_POLL):
        await tick.enqueue_many(client, list(range(40)), group="tenant")
        await until_completed(cyclone_env, 15)


class ClaimLog:
    """Which claim statement the worker sent, in order, and how many tasks each took."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.claims: list[tuple[str, int]] = []
        for name in ("task_claim", "task_claim_plain"):
            monkeypatch.setattr(db, name, self._logged(name, getattr(db, name)))

    def _logged(
        self, name: str, claim: Callable[..., Awaitable[db.ClaimedRows]]
    ) -> Callable[..., Awaitable[db.ClaimedRows]]:
        async def logged(*args: Any) -> db.ClaimedRows:
            rows = await claim(*args)
            if not rows.declined:
                self.claims.append((name, len(rows)))
            return rows

        return logged


async def test_after_a_resume_the_plain_claim_is_back_at_once(
    cyclone_env: CycloneEnv, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While paused the worker claims by task_claim (the plain claim declines); after the
    resume, the first claims that find the queue free of flow control say so, and every
    claim after them is the plain one."""
    log = ClaimLog(monkeypatch)
    client = cyclone_env.client
    await client.queues.pause("paced", create=True)
    runs = await tick.enqueue_many(client, list(range(300)))
    async with fast_worker(client, steps=[tick], queues={"paced": 2}, poll_interval=NO_POLL):
        async with asyncio.timeout(60):  # the start's claim, declined and then held
            while not log.claims:  # noqa: ASYNC110 - the worker's first claim, in its own task
                await asyncio.sleep(0.01)
        assert log.claims[-1] == ("task_claim", 0)  # paused: nothing started
        log.claims.clear()
        await client.queues.resume("paced")
        for run in runs:
            assert await run.wait(timeout=60) is cyclone.RunState.COMPLETED
    full = [n for name, n in log.claims if name == "task_claim"]
    # At most the claims in flight together when the first came back; then plain ones only.
    assert len(full) <= 2, log.claims
    assert log.claims[len(full) :] == [(n, k) for n, k in log.claims if n == "task_claim_plain"]
