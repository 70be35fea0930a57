"""Wakeup rules, observed with a real LISTEN connection counting notifications per queue."""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import uuid

import asyncpg
import pytest

import cyclone
from cyclone._services.publisher import ENDS_LAG
from cyclone._services.transitions import Effects
from cyclone._storage import queries as db
from cyclone.testing.plugin import CycloneEnv
from tests.conftest import Listener, queue_wakeups


@cyclone.step("mail.send", queue="mail")
async def mail(ctx: cyclone.Context, n: int) -> int:
    return n


@cyclone.step("sms.send", queue="sms")
async def sms(ctx: cyclone.Context, n: int) -> int:
    return n


async def test_publish_sends_one_notify_per_distinct_queue(
    cyclone_env: CycloneEnv, listener: Listener
) -> None:
    client = cyclone_env.client
    async with cyclone_env.pool.acquire() as conn:
        ttx, wakeups = cyclone.track_wakeups(conn)
        async with ttx.transaction():
            await mail.enqueue_tx(client, ttx, 1)
            await mail.enqueue_many_tx(client, ttx, [2, 3])
            await cyclone.enqueue_tx(client, ttx, sms, 4)
        assert sorted(wakeups) == ["mail", "sms"]
        assert len(wakeups) == 2 and wakeups
        await client.publish_wakeups(wakeups)
    await listener.settle()
    assert listener.counts() == {"q:mail": 1, "q:sms": 1}
    # Publishing clears the set: a second publish sends nothing.
    assert not wakeups
    await client.publish_wakeups(wakeups)
    await listener.settle()
    assert listener.counts() == {"q:mail": 1, "q:sms": 1}


async def test_nothing_is_sent_inside_the_callers_transaction(
    cyclone_env: CycloneEnv, listener: Listener
) -> None:
    async with cyclone_env.pool.acquire() as conn:
        ttx, wakeups = cyclone.track_wakeups(conn)
        async with ttx.transaction():
            await mail.enqueue_tx(cyclone_env.client, ttx, 1)
        # Committed, not published: a NOTIFY issued in the transaction would have arrived.
        await listener.settle()
        assert listener.payloads == []
        assert list(wakeups) == ["mail"]


async def test_future_job_records_nothing(cyclone_env: CycloneEnv, listener: Listener) -> None:
    later = dt.datetime.now(dt.UTC) + dt.timedelta(hours=1)
    async with cyclone_env.pool.acquire() as conn:
        ttx, wakeups = cyclone.track_wakeups(conn)
        async with ttx.transaction():
            await mail.enqueue_tx(cyclone_env.client, ttx, 1, process_at=later)
            await mail.enqueue_many_tx(cyclone_env.client, ttx, [1], process_in=60)
        assert not wakeups
        await cyclone_env.client.publish_wakeups(wakeups)
    await listener.settle()
    assert listener.payloads == []


async def test_rollback_discards_wakeups(cyclone_env: CycloneEnv, listener: Listener) -> None:
    async with cyclone_env.pool.acquire() as conn:
        ttx, wakeups = cyclone.track_wakeups(conn)
        tx = ttx.transaction()
        await tx.start()
        await mail.enqueue_tx(cyclone_env.client, ttx, 1)
        assert list(wakeups) == []  # recorded in the open block, not yet committed
        await tx.rollback()
        assert not wakeups
        await cyclone_env.client.publish_wakeups(wakeups)
    await listener.settle()
    assert listener.payloads == []


async def test_exception_in_block_discards_wakeups(cyclone_env: CycloneEnv) -> None:
    async with cyclone_env.pool.acquire() as conn:
        ttx, wakeups = cyclone.track_wakeups(conn)
        with pytest.raises(RuntimeError):
            async with ttx.transaction():
                await mail.enqueue_tx(cyclone_env.client, ttx, 1)
                raise RuntimeError("business rule broken")
        assert not wakeups


async def test_savepoint_rollback_discards_only_its_own(
    cyclone_env: CycloneEnv, listener: Listener
) -> None:
    client = cyclone_env.client
    async with cyclone_env.pool.acquire() as conn:
        ttx, wakeups = cyclone.track_wakeups(conn)
        async with ttx.transaction():
            await mail.enqueue_tx(client, ttx, 1)
            savepoint = ttx.transaction()
            await savepoint.start()
            await sms.enqueue_tx(client, ttx, 2)
            await savepoint.rollback()
            async with ttx.transaction():  # a savepoint that commits keeps its wakeups
                await mail.enqueue_tx(client, ttx, 3)
        assert list(wakeups) == ["mail"]
        await client.publish_wakeups(wakeups)
    await listener.settle()
    assert listener.counts() == {"q:mail": 1}
    assert await cyclone_env.pool.fetchval("SELECT count(*) FROM cyclone_runs") == 2


async def test_failed_commit_discards_wakeups(cyclone_env: CycloneEnv) -> None:
    await cyclone_env.pool.execute(
        "CREATE TABLE codes (code int UNIQUE DEFERRABLE INITIALLY DEFERRED)"
    )
    async with cyclone_env.pool.acquire() as conn:
        ttx, wakeups = cyclone.track_wakeups(conn)
        with pytest.raises(asyncpg.UniqueViolationError):
            async with ttx.transaction():
                await mail.enqueue_tx(cyclone_env.client, ttx, 1)
                await conn.execute("INSERT INTO codes VALUES (1), (1)")  # fails at COMMIT
        assert not wakeups
    assert await cyclone_env.pool.fetchval("SELECT count(*) FROM cyclone_runs") == 0


async def test_records_without_tracked_block_are_kept(cyclone_env: CycloneEnv) -> None:
    # Tracking a connection whose transaction the caller opened itself: the wrapper cannot
    # see that transaction end, so what it recorded stays (a spurious wakeup at worst).
    async with cyclone_env.pool.acquire() as conn, conn.transaction():
        ttx, wakeups = cyclone.track_wakeups(conn)
        await mail.enqueue_tx(cyclone_env.client, ttx, 1)
        assert list(wakeups) == ["mail"]


async def test_client_transaction_publishes_after_commit(
    cyclone_env: CycloneEnv, listener: Listener
) -> None:
    client = cyclone_env.client
    async with cyclone_env.pool.acquire() as conn:
        async with client.transaction(conn) as tx:
            await sms.enqueue_tx(client, tx, 1)
        await listener.settle()
        assert listener.counts() == {"q:sms": 1}
        with pytest.raises(ZeroDivisionError):
            async with client.transaction(conn) as tx:
                await mail.enqueue_tx(client, tx, 1)
                _ = 1 / 0
    await listener.settle()
    assert listener.counts() == {"q:sms": 1}


async def test_plain_enqueue_publishes_after_its_own_commit(
    cyclone_env: CycloneEnv, listener: Listener
) -> None:
    await mail.enqueue(cyclone_env.client, 1)
    await sms.enqueue_many(cyclone_env.client, [1, 2, 3])
    await mail.enqueue(cyclone_env.client, 1, process_in=3600)
    await cyclone_env.client.aclose()  # wakeups of plain enqueues go out in the background
    await listener.settle()
    assert listener.counts() == {"q:mail": 1, "q:sms": 1}


async def test_producer_client_without_listening_still_publishes(
    cyclone_env: CycloneEnv, listener: Listener
) -> None:
    producer = cyclone.Client(cyclone_env.pool, notify=False)
    async with cyclone_env.pool.acquire() as conn:
        ttx, wakeups = cyclone.track_wakeups(conn)
        async with ttx.transaction():
            await mail.enqueue_tx(producer, ttx, 1)
        await producer.publish_wakeups(wakeups)
    await listener.settle()
    assert listener.counts() == {"q:mail": 1}


async def test_coalescing_window_merges_publishes(
    cyclone_env: CycloneEnv, listener: Listener
) -> None:
    client = cyclone.Client(cyclone_env.pool, notify_coalesce=3600)
    for n in range(3):
        async with cyclone_env.pool.acquire() as conn:
            ttx, wakeups = cyclone.track_wakeups(conn)
            async with ttx.transaction():
                await mail.enqueue_tx(client, ttx, n)
                await sms.enqueue_tx(client, ttx, n)
            await client.publish_wakeups(wakeups)
    await listener.settle()
    assert listener.payloads == []  # held for the window
    await client.aclose()  # closing flushes what the window holds
    await listener.settle()
    assert listener.counts() == {"q:mail": 1, "q:sms": 1}


async def test_failed_publish_is_logged_not_raised(
    cyclone_env: CycloneEnv, caplog: pytest.LogCaptureFixture
) -> None:
    pool = await asyncpg.create_pool(cyclone_env.dsn, min_size=0, max_size=1)
    client = cyclone.Client(pool)
    async with pool.acquire() as conn:
        ttx, wakeups = cyclone.track_wakeups(conn)
        async with ttx.transaction():
            await mail.enqueue_tx(client, ttx, 1)
    await pool.close()
    with caplog.at_level(logging.WARNING, logger="cyclone"):
        await client.publish_wakeups(wakeups)  # must not raise
    assert "publishing 1 wakeups failed" in caplog.text


@pytest.mark.parametrize("shortcut", [False, True], ids=["publish_wakeups", "transaction"])
async def test_publishing_while_every_connection_is_held(
    cyclone_env: CycloneEnv, listener: Listener, shortcut: bool
) -> None:
    """Request handlers that each hold a pooled connection and publish before giving it back
    (as the docs show) must not wait for a connection none of them will release."""
    pool = await asyncpg.create_pool(cyclone_env.dsn, min_size=2, max_size=2)
    client = cyclone.Client(pool)
    all_holding = asyncio.Barrier(2)

    async def handler(n: int) -> None:
        async with pool.acquire() as conn:
            await all_holding.wait()  # both of the pool's connections are held now
            if shortcut:
                async with client.transaction(conn) as tx:
                    await mail.enqueue_tx(client, tx, n)
            else:
                ttx, wakeups = cyclone.track_wakeups(conn)
                async with ttx.transaction():
                    await sms.enqueue_tx(client, ttx, n)
                await client.publish_wakeups(wakeups)

    try:
        async with asyncio.timeout(30):
            await asyncio.gather(handler(1), handler(2))
        await client.aclose()  # what waited for a connection goes out now
    finally:
        await pool.close()
    await listener.settle()
    # Each shortcut publishes on its own connection; publish_wakeups may merge the two.
    assert set(listener.counts()) == ({"q:mail"} if shortcut else {"q:sms"})


async def test_shortcut_inside_an_untracked_transaction_publishes_outside_it(
    cyclone_env: CycloneEnv, listener: Listener
) -> None:
    """``client.transaction(conn)`` nested in the caller's own untracked transaction is a
    savepoint, and nothing tells it when the outer transaction commits. Its NOTIFY must
    still not join that transaction (it could make the commit fail): it goes out through
    the pool when the block ends. Rolling the outer transaction back shows it did."""
    client = cyclone_env.client
    async with cyclone_env.pool.acquire() as conn:
        outer = conn.transaction()
        await outer.start()
        async with client.transaction(conn) as tx:
            await mail.enqueue_tx(client, tx, 1)
        await outer.rollback()
    await listener.settle()
    assert listener.counts() == {"q:mail": 1}


async def test_shortcut_inside_a_tracked_transaction_joins_its_wakeups(
    cyclone_env: CycloneEnv, listener: Listener
) -> None:
    """Given a tracked connection with its transaction open, the shortcut is a savepoint
    whose wakeups are published with the outer block's, after the outer commit."""
    client = cyclone_env.client
    async with cyclone_env.pool.acquire() as conn:
        ttx, wakeups = cyclone.track_wakeups(conn)
        async with ttx.transaction():
            async with client.transaction(ttx) as tx:
                await mail.enqueue_tx(client, tx, 1)
            with pytest.raises(ZeroDivisionError):
                async with client.transaction(ttx) as tx:
                    await sms.enqueue_tx(client, tx, 1)
                    _ = 1 / 0
            await listener.settle()
            assert listener.payloads == []  # nothing before the outer commit
        assert list(wakeups) == ["mail"]  # the rolled-back savepoint's wakeup is gone
        await client.publish_wakeups(wakeups)
        # On a tracked connection with no transaction open, the block publishes on commit.
        async with client.transaction(ttx) as tx:
            await sms.enqueue_tx(client, tx, 2)
    await listener.settle()
    assert listener.counts() == {"q:mail": 1, "q:sms": 1}


async def test_maintenance_announces_what_committed_when_a_later_step_fails(
    cyclone_env: CycloneEnv, listener: Listener, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pass reclaims a task (committed), then its next statement fails: the reclaimed
    task's queue is still woken, not left to the next poll."""
    client = cyclone_env.client
    await mail.enqueue(client, 1)
    async with cyclone_env.pool.acquire() as conn:
        await db.task_claim(
            conn, client._queries, db.ClaimRequest("mail", ["mail.send"], 1, 30.0, "w", [])
        )
        await conn.execute("UPDATE cyclone_tasks SET lease_until = now() - interval '1 hour'")
    await client.aclose()
    await listener.settle()
    listener.payloads.clear()

    async def broken(*args: object, **kwargs: object) -> list[asyncpg.Record]:
        raise asyncpg.ConnectionDoesNotExistError("connection lost")

    monkeypatch.setattr(db, "task_expired_exhausted", broken)
    with pytest.raises(asyncpg.ConnectionDoesNotExistError):
        await cyclone_env.worker(steps=[mail]).maintain_once()
    await client.aclose()
    await listener.settle()
    assert listener.counts() == {"q:mail": 1}


async def test_plain_enqueue_sends_its_wakeup_with_its_commit(
    cyclone_env: CycloneEnv, listener: Listener
) -> None:
    """The insert's own statement carries the NOTIFY: the wakeup is out when enqueue returns,
    so closing the pool right after (without client.aclose) loses nothing."""
    pool = await asyncpg.create_pool(cyclone_env.dsn, min_size=1, max_size=2)
    client = cyclone.Client(pool)
    await mail.enqueue(client, 1)
    await sms.enqueue(client, 2, unique="only")
    with pytest.raises(cyclone.DuplicateError):  # inserts nothing, so wakes nobody
        await sms.enqueue(client, 3, unique="only")
    await pool.close()
    await listener.settle()
    assert listener.counts() == {"q:mail": 1, "q:sms": 1}


async def test_sequenced_enqueue_publishes_after_its_transaction(
    cyclone_env: CycloneEnv, listener: Listener
) -> None:
    """A sequenced enqueue commits its lock and insert together; its wakeup follows."""
    await mail.enqueue(cyclone_env.client, 1, sequence="s")
    await cyclone_env.client.aclose()
    await listener.settle()
    assert listener.counts() == {"q:mail": 1}


async def test_the_coalescing_window_holds_under_steady_publishing(
    cyclone_env: CycloneEnv, listener: Listener
) -> None:
    """Publishes that keep coming, some while a NOTIFY is in flight, still go out at most
    once per window: not back to back once the first window has closed."""
    window = 0.2
    client = cyclone.Client(cyclone_env.pool, notify_coalesce=window)
    publisher = client.services.publisher
    loop = asyncio.get_running_loop()
    end = loop.time() + 1.0
    while loop.time() < end:
        publisher.wake(["steady"])
        await asyncio.sleep(0)  # the event loop's turn: a NOTIFY in flight goes on
    await client.aclose()
    await listener.settle()
    sent = listener.counts()["q:steady"]
    # One per window over the second, plus the one aclose() flushes; back to back, hundreds.
    assert 1 <= sent <= 1.0 / window + 2


async def test_run_ends_of_steady_outcome_writes_share_their_notifies(
    cyclone_env: CycloneEnv, listener: Listener
) -> None:
    """Run ends announced after every batch go out at most once per ENDS_LAG while they keep
    coming (one NOTIFY each, back to back, before): each NOTIFY is a durable commit."""
    publisher = cyclone_env.client.services.publisher
    ended = Effects(ended={uuid.uuid4()})  # the same payload each time: one per NOTIFY
    loop = asyncio.get_running_loop()
    end = loop.time() + 0.5
    while loop.time() < end:
        publisher.announce(ended)
        await asyncio.sleep(0)  # the event loop's turn: a NOTIFY in flight goes on
    await cyclone_env.client.aclose()
    await listener.settle()
    [payload] = listener.counts()
    assert 1 <= listener.counts()[payload] <= 0.5 / ENDS_LAG + 2


async def test_this_process_gets_its_wakeups_without_waiting_for_them_to_come_back(
    cyclone_env: CycloneEnv, listener: Listener
) -> None:
    client = cyclone_env.client
    async with queue_wakeups(client) as seen, cyclone_env.pool.acquire() as conn:
        # Sent in a transaction that is still open, the NOTIFY cannot have come back yet.
        async with conn.transaction():
            await client.services.publisher.send(["q:mail"], conn)
            assert seen.queues == ["mail"]
        # It comes back once committed, and is not dispatched a second time.
        await listener.settle()
        assert listener.counts() == {"q:mail": 1}
        await conn.execute("SELECT pg_notify($1, 'q:mail')", client._channel)  # another's
        await conn.execute("SELECT pg_notify($1, 'q:last')", client._channel)
        await seen.until(3)  # delivered in order: the first came back before these
        assert seen.queues == ["mail", "mail", "last"]


async def test_a_wakeup_whose_notify_failed_lets_the_next_notification_through(
    cyclone_env: CycloneEnv,
) -> None:
    client = cyclone_env.client
    async with queue_wakeups(client) as seen:
        closed = await asyncpg.connect(cyclone_env.dsn)
        await closed.close()
        await client.services.publisher.send(["q:sms"], closed)  # logged, not raised
        assert seen.queues == ["sms"]
        await cyclone_env.pool.execute("SELECT pg_notify($1, 'q:sms')", client._channel)
        await seen.until(2)
        assert seen.queues == ["sms", "sms"]


async def test_a_run_end_reaches_this_processs_waiters_before_its_notify(
    cyclone_env: CycloneEnv, listener: Listener
) -> None:
    """A run end waiting for company (ENDS_LAG) is dispatched here at once, as the run's
    waiter in the worker's own process needs it; its NOTIFY follows, not dispatched again."""
    client = cyclone_env.client
    publisher = client.services.publisher
    run_id = uuid.uuid4()
    async with queue_wakeups(client):
        notifier = client.services.notifier
        assert notifier is not None
        dispatched: list[str] = []
        unsubscribe = notifier.subscribe_all(dispatched.append)
        ended = notifier.watch_run(run_id)
        try:
            publisher.wake(["mail"])  # a NOTIFY just went out: the end waits for company
            await asyncio.sleep(0)
            publisher.announce(Effects(ended={run_id}))
            assert ended.is_set()
            await client.aclose()  # sends what waits
            await listener.settle()
            [payload] = [p for p in listener.counts() if p.startswith("r:")]
            assert listener.counts()[payload] == 1
            assert dispatched.count(payload) == 1
        finally:
            notifier.unwatch_run(run_id, ended)
            unsubscribe()
