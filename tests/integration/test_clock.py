"""Cyclone's SQL reads the time from one clock expression, which a test can move: work due in
an hour is claimable at once, a lease expires without waiting for it."""

from __future__ import annotations

import datetime as dt

import cyclone
from cyclone._storage import queries as db
from cyclone._storage.loader import Queries
from cyclone.testing.plugin import CycloneEnv

# The real time, moved by this connection's cyclone.test_offset (none: not moved).
MOVABLE = (
    "now() + coalesce(nullif(current_setting('cyclone.test_offset', true), ''), '0s')::interval"
)


@cyclone.step("clock.later", queue="clock")
async def later(ctx: cyclone.Context, n: int) -> int:
    return n


async def test_work_due_later_is_claimable_once_the_clock_moves(cyclone_env: CycloneEnv) -> None:
    run = await later.enqueue(cyclone_env.client, 1, process_in=dt.timedelta(hours=1))
    q = Queries(cyclone_env.client._queries.schema, clock=MOVABLE)
    async with cyclone_env.pool.acquire() as conn:
        assert (
            await db.task_claim(conn, q, db.ClaimRequest("clock", [later.name], 10, 30.0, "w", []))
            == []
        )
        assert not await db.task_pending_work(conn, q, [later.name], [])
        await conn.execute("SET cyclone.test_offset = '61 minutes'")
        assert await db.task_pending_work(conn, q, [later.name], [])
        claimed = await db.task_claim(
            conn, q, db.ClaimRequest("clock", [later.name], 10, 30.0, "w", [])
        )
        assert [r["run_id"] for r in claimed] == [run.id]


async def test_a_lease_expires_once_the_clock_moves_past_it(cyclone_env: CycloneEnv) -> None:
    run = await later.enqueue(cyclone_env.client, 2)
    q = Queries(cyclone_env.client._queries.schema, clock=MOVABLE)
    async with cyclone_env.pool.acquire() as conn:
        (task,) = await db.task_claim(
            conn, q, db.ClaimRequest("clock", [later.name], 10, 30.0, "w1", [])
        )
        assert await db.task_reclaim(conn, q, 100) == []
        await conn.execute("SET cyclone.test_offset = '31 seconds'")
        (reclaimed,) = await db.task_reclaim(conn, q, 100)
        assert (reclaimed["run_id"], reclaimed["lost_by"]) == (run.id, "w1")
        # The attempt that held the lease no longer owns the task: its heartbeat is refused.
        owned = await db.task_heartbeat(
            conn, q, db.Fence([run.id], [task["id"]], [task["claims"]]), 30.0
        )
        assert owned == set()
    # A job's one node: its task, available again from the moved time, which the real clock
    # (the client's) sees 31 seconds ahead.
    (node,) = (await run.info()).nodes
    assert (node.state, [e["type"] for e in node.errors]) == ("scheduled", ["LeaseExpired"])


# A clock that stands still: this connection's cyclone.test_now.
STILL = "current_setting('cyclone.test_now')::timestamptz"


async def test_a_claim_whose_clock_is_behind_the_last_ones_still_counts_its_window(
    cyclone_env: CycloneEnv,
) -> None:
    # Claims take turns on the queue's row, but each reads the time its transaction began,
    # so a claim may come after another whose clock is ahead of its own.
    client = cyclone_env.client
    await client.queues.set_limits("clock", key_rate=10, key_per=1.0, create=True)
    await later.enqueue_many(client, list(range(30)), group="a")
    q = Queries(client._queries.schema, clock=STILL)

    async def claim(at: str, limit: int) -> int:
        await conn.execute(f"SET cyclone.test_now = '2030-01-01 00:00:{at}+00'")
        request = db.ClaimRequest("clock", [later.name], limit, 30.0, "w", [])
        return len(await db.task_claim(conn, q, request))

    async with cyclone_env.pool.acquire() as conn:
        assert await claim("00.0", 10) == 10  # the key's first window is full
        assert await claim("01.5", 3) == 3  # a window later
        # Half a second behind that: its window holds the first 10 and those 3.
        assert await claim("00.9", 10) == 0
