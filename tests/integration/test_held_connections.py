"""The connections a worker keeps from one claim to the next and from one outcome batch to
the next (``cyclone._services.database.Held``): reused while they work, given back when the
pool needs them, and replaced, never reused, when the server ends them, with no job lost or
run twice.
"""

from __future__ import annotations

import asyncio
import uuid

import asyncpg
import pytest

import cyclone
from cyclone._services.database import Database, Held
from cyclone._services.transitions import Effects
from cyclone.testing.plugin import CycloneEnv
from tests.conftest import Probe, fast_worker

probe = Probe()
LONG = 3600.0  # a hold no test outlasts: what is given back is given back for another reason
JOBS = 40
FLUSHES = 5


@cyclone.step("held.record", queue="held")
async def record(ctx: cyclone.Context, n: int) -> int:
    probe.calls.append(n)
    return n


@pytest.fixture
def env(cyclone_env: CycloneEnv) -> CycloneEnv:
    probe.reset()
    return cyclone_env


async def backend(conn: asyncpg.pool.PoolConnectionProxy) -> int:
    pid: int = await conn.fetchval("SELECT pg_backend_pid()")
    return pid


async def terminate(env: CycloneEnv, pids: list[int]) -> None:
    """End the backends ``pids`` from a connection of the test's own, and wait until gone."""
    await env.pool.execute("SELECT pg_terminate_backend(pid) FROM unnest($1::int[]) pid", pids)
    async with asyncio.timeout(30):  # until the server has ended them (observed, not slept on)
        while await env.pool.fetchval(  # noqa: ASYNC110 - another session's state
            "SELECT count(*) FROM pg_stat_activity WHERE pid = ANY($1)", pids
        ):
            await asyncio.sleep(0.01)


async def running(env: CycloneEnv, statement: str) -> list[int]:
    """The backends whose last statement was Cyclone's ``statement``: connections held by a
    worker (a connection given back to the pool was reset since)."""
    text = env.client._queries[statement]
    rows = await env.pool.fetch(
        "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
        " AND left(query, 200) = left($1, 200)",
        text,
    )
    return [r["pid"] for r in rows]


async def test_a_held_connection_serves_use_after_use(env: CycloneEnv) -> None:
    held = Held(env.client.services.database, hold=LONG)
    async with held.use() as conn:
        pid = await backend(conn)
    for _ in range(3):
        async with held.use() as conn:
            assert await backend(conn) == pid
    held.release()


async def test_a_connection_whose_backend_died_is_replaced_not_reused(env: CycloneEnv) -> None:
    held = Held(env.client.services.database, hold=LONG)
    async with held.use() as conn:
        pid = await backend(conn)
    await terminate(env, [pid])
    fresh = None
    for _ in range(2):
        # asyncpg may not have read the server's goodbye yet: then this use fails on the dead
        # connection and gives it back, and the next one takes a fresh connection.
        try:
            async with held.use() as conn:
                fresh = await backend(conn)
            break
        except (asyncpg.InterfaceError, asyncpg.InternalClientError, ConnectionError):
            continue
    assert fresh is not None and fresh != pid
    async with held.use() as conn:
        assert await backend(conn) == fresh  # and that one is held in turn
    held.release()


async def test_a_use_that_raised_gives_its_connection_back(env: CycloneEnv) -> None:
    held = Held(env.client.services.database, hold=LONG)
    with pytest.raises(asyncpg.PostgresError):
        async with held.use() as conn:
            pid = await backend(conn)
            await conn.execute("SELECT 1/0")
    async with held.use() as conn:
        assert await backend(conn) != pid
    held.release()


async def test_nothing_is_held_when_the_pool_has_no_connection_to_spare(env: CycloneEnv) -> None:
    async with asyncpg.create_pool(env.dsn, min_size=1, max_size=1) as pool:
        database = Database(pool, env.client._queries, listens=False)
        held = Held(database, hold=LONG)
        async with held.use() as conn:
            await backend(conn)
        await database.aclose()  # the release in flight is done
        assert pool.get_idle_size() == 1  # given back: whoever waits for the pool gets it
        held.release()


async def test_a_connection_held_past_its_time_goes_back_to_the_pool(env: CycloneEnv) -> None:
    database = env.client.services.database
    held = Held(database, hold=0.05)
    async with held.use() as conn:
        pid = await backend(conn)
    async with asyncio.timeout(30):  # its timer gives it back: observed, not slept on
        while await running_pid(env, pid):  # noqa: ASYNC110 - another session's state
            await asyncio.sleep(0.01)


async def running_pid(env: CycloneEnv, pid: int) -> bool:
    """Whether backend ``pid``'s last statement is still the test's ``pg_backend_pid()``."""
    query = await env.pool.fetchval("SELECT query FROM pg_stat_activity WHERE pid = $1", pid)
    return query == "SELECT pg_backend_pid()"


async def test_a_worker_whose_held_connections_are_terminated_keeps_claiming_and_completing(
    env: CycloneEnv,
) -> None:
    client = env.client
    async with fast_worker(client, steps=[record], queues={"held": 4}) as worker:
        await record.enqueue_many(client, list(range(JOBS // 2)))
        await asyncio.wait_for(worker.drain(), 60)
        held = await running(env, "task_claim_plain") + await running(env, "job_complete_many")
        assert held  # the worker keeps at least its claims' connection
        await terminate(env, held)
        await record.enqueue_many(client, list(range(JOBS // 2, JOBS)))
        await asyncio.wait_for(worker.drain(), 60)
        assert set(await running(env, "task_claim_plain")).isdisjoint(held)  # replaced
    assert sorted(probe.calls) == list(range(JOBS))  # each job ran once: none lost or repeated
    counts = await env.pool.fetch("SELECT state, count(*) FROM cyclone_runs GROUP BY state")
    assert {r["state"]: r["count"] for r in counts} == {"completed": JOBS}


async def test_a_claim_and_a_batch_whose_connection_dies_under_them_are_tried_again(
    env: CycloneEnv,
) -> None:
    client = env.client
    # One-shot kills, one of the claim's connection and one of a batch's, while the statement
    # runs (sequences are not transactional: the statement's rollback does not re-arm them).
    await env.pool.execute(
        "CREATE SEQUENCE claim_kills; CREATE SEQUENCE batch_kills;"
        "CREATE FUNCTION kill_once() RETURNS trigger LANGUAGE plpgsql AS $$"
        " BEGIN IF nextval(TG_ARGV[0]) = 1 THEN"
        "   PERFORM pg_terminate_backend(pg_backend_pid()); PERFORM pg_sleep(5); END IF;"
        " RETURN coalesce(NEW, OLD); END $$;"
        "CREATE TRIGGER kill_claim BEFORE UPDATE ON cyclone_tasks FOR EACH ROW"
        " WHEN (OLD.state = 'available' AND NEW.state = 'running')"
        " EXECUTE FUNCTION kill_once('claim_kills');"
        "CREATE TRIGGER kill_batch BEFORE DELETE ON cyclone_tasks FOR EACH ROW"
        " WHEN (OLD.state = 'running') EXECUTE FUNCTION kill_once('batch_kills')"
    )
    await record.enqueue_many(client, list(range(JOBS)))
    async with fast_worker(client, steps=[record], queues={"held": 4}) as worker:
        await asyncio.wait_for(worker.drain(), 60)
    kills = await env.pool.fetchrow(
        "SELECT claim_kills.last_value c, batch_kills.last_value b FROM claim_kills, batch_kills"
    )
    assert kills["c"] > 1 and kills["b"] > 1  # both kills happened, and work went on after
    assert sorted(probe.calls) == list(range(JOBS))
    attempts = await env.pool.fetchval("SELECT max(attempts) FROM cyclone_runs")
    assert attempts == 1  # the claim that died claimed nothing: no lease had to run out


async def test_a_stopped_worker_holds_no_connection(env: CycloneEnv) -> None:
    client = env.client
    async with fast_worker(client, steps=[record], queues={"held": 4, "other": 2}) as worker:
        await record.enqueue_many(client, list(range(JOBS)))
        await asyncio.wait_for(worker.drain(), 60)
    await client.services.database.aclose()  # the releases in flight are done
    assert env.pool.get_idle_size() == env.pool.get_size()


async def test_run_ends_announced_one_after_another_keep_their_connection(
    env: CycloneEnv,
) -> None:
    # Under load a worker's run ends go out every ENDS_LAG, each NOTIFY after the last one's
    # lag: a pool acquire (and reset) for each was a round trip for nothing. Acquires are
    # counted by the pool's own setup hook.
    acquires = 0

    async def counted(conn: asyncpg.Connection) -> None:
        nonlocal acquires
        acquires += 1

    notified: asyncio.Queue[str] = asyncio.Queue()
    listener = await asyncpg.connect(env.dsn)
    async with asyncpg.create_pool(env.dsn, min_size=2, max_size=4, setup=counted) as pool:
        client = cyclone.Client(pool)
        publisher = client.services.publisher
        await listener.add_listener(publisher.channel, lambda *a: notified.put_nowait(a[3]))
        for _ in range(FLUSHES):
            ended = uuid.uuid4()
            publisher.announce(Effects(ended={ended}))  # goes out ENDS_LAG after the last
            assert await asyncio.wait_for(notified.get(), 30) == f"r:{ended}"
        # One, or one more for each HOLD the test took (a machine too busy to keep up);
        # one for each NOTIFY when each takes a connection from the pool.
        assert acquires < FLUSHES
        await publisher.settle(30)  # what a worker that stops does: it gives the connection back
        await client.aclose()  # the release in flight is done
        assert pool.get_idle_size() == pool.get_size()
    await listener.close()
