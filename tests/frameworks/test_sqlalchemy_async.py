"""cyclone.Client in a SQLAlchemy AsyncSession on asyncpg: the session's transaction is the
caller's, and its wakeups go out after the session's commit (and not for a savepoint that
rolled back)."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, create_async_engine

import cyclone
from cyclone.testing.plugin import CycloneEnv
from tests.conftest import Listener, waiting_on_a_lock
from tests.frameworks.conftest import ORDERS, Order, audit, checkout, ship


@pytest_asyncio.fixture
async def engine(cyclone_env: CycloneEnv) -> AsyncIterator[AsyncEngine]:
    await cyclone_env.pool.execute(ORDERS)
    made = create_async_engine(cyclone_env.dsn.replace("postgresql://", "postgresql+asyncpg://"))
    try:
        yield made
    finally:
        await made.dispose()


async def insert_order(session: AsyncSession, ref: str) -> None:
    await session.execute(sa.text("INSERT INTO public.orders (ref) VALUES (:ref)"), {"ref": ref})


async def refs(env: CycloneEnv) -> list[str]:
    return [r["ref"] for r in await env.pool.fetch("SELECT ref FROM public.orders ORDER BY ref")]


async def woken(listener: Listener, count: int) -> Counter[str]:
    """The wakeups, once ``count`` arrived (the session's commit publishes in the background)
    and everything sent before now was delivered."""
    async with asyncio.timeout(30):
        while len(listener.payloads) < count:
            listener.arrived.clear()
            await listener.arrived.wait()
    await listener.settle()
    return listener.counts()


async def test_commit_writes_both_and_wakes_after_the_commit(
    cyclone_env: CycloneEnv, engine: AsyncEngine, listener: Listener
) -> None:
    client = cyclone_env.client
    async with AsyncSession(engine) as session:
        async with session.begin():
            # Nothing ran on the session yet: Cyclone's write must still join its transaction.
            run = await ship.enqueue_tx(client, session, Order("o-1"))
            await insert_order(session, "o-1")
            with pytest.raises(cyclone.RunNotFoundError):
                await run.status()
            await listener.settle()
            assert listener.counts() == {}
        assert await woken(listener, 1) == {"q:ship": 1}
    assert await refs(cyclone_env) == ["o-1"]
    assert await run.status() is cyclone.RunState.PENDING


async def test_an_orm_session_before_any_statement_joins_the_transaction(
    cyclone_env: CycloneEnv, engine: AsyncEngine
) -> None:
    async with AsyncSession(engine) as session, session.begin():
        run = await ship.enqueue_tx(cyclone_env.client, session, Order("first"))
        await session.rollback()
    with pytest.raises(cyclone.RunNotFoundError):
        await cyclone_env.client.get_run(run.id)


async def test_rollback_leaves_nothing_and_sends_nothing(
    cyclone_env: CycloneEnv, engine: AsyncEngine, listener: Listener
) -> None:
    client = cyclone_env.client
    with pytest.raises(ZeroDivisionError):
        async with AsyncSession(engine) as session, session.begin():
            await insert_order(session, "o-2")
            run = await cyclone.enqueue_tx(client, session, ship, Order("o-2"))
            await checkout.submit_once_tx(client, session, "k-2", Order("o-2"))
            1 / 0  # noqa: B018
    with pytest.raises(cyclone.RunNotFoundError):
        await client.get_run(run.id)
    assert (await client.list_runs()).runs == []
    assert await refs(cyclone_env) == []
    await listener.settle()
    assert listener.counts() == {}


async def test_a_savepoint_that_rolls_back_drops_its_wakeups(
    cyclone_env: CycloneEnv, engine: AsyncEngine, listener: Listener
) -> None:
    client = cyclone_env.client
    async with AsyncSession(engine) as session:
        async with session.begin():
            kept = await ship.enqueue_tx(client, session, Order("kept"))
            with pytest.raises(ZeroDivisionError):
                async with session.begin_nested():
                    dropped = await audit.enqueue_tx(client, session, Order("dropped"))
                    1 / 0  # noqa: B018
            async with session.begin_nested():
                await ship.enqueue_tx(client, session, Order("released"))
        assert await woken(listener, 1) == {"q:ship": 1}
    assert await kept.status() is cyclone.RunState.PENDING
    with pytest.raises(cyclone.RunNotFoundError):
        await dropped.status()


async def test_track_wakeups_and_client_transaction_on_a_session(
    cyclone_env: CycloneEnv, engine: AsyncEngine, listener: Listener
) -> None:
    client = cyclone_env.client
    async with AsyncSession(engine) as session:
        ttx, wakeups = cyclone.track_wakeups(session)
        async with session.begin():
            await ship.enqueue_tx(client, ttx, Order("tracked"))
        assert list(wakeups) == ["ship"]  # kept for the caller, not published
        await listener.settle()
        assert listener.counts() == {}
        await client.publish_wakeups(wakeups)
    await listener.settle()
    assert listener.counts() == {"q:ship": 1}
    async with AsyncSession(engine) as session:
        async with client.transaction(session) as tx:
            await audit.enqueue_tx(client, tx, Order("in client.transaction"))
        assert await woken(listener, 2) == {"q:ship": 1, "q:audit": 1}


async def test_submit_once_tx_same_key_twice_and_a_second_session_waits(
    cyclone_env: CycloneEnv, engine: AsyncEngine
) -> None:
    client = cyclone_env.client

    async def second() -> tuple[cyclone.Run, bool]:
        async with AsyncSession(engine) as other, other.begin():
            return await checkout.submit_once_tx(client, other, "k-3", Order("o-3"))

    async with AsyncSession(engine) as session:
        async with session.begin():
            run, created = await checkout.submit_once_tx(client, session, "k-3", Order("o-3"))
            again, again_created = await checkout.submit_once_tx(
                client, session, "k-3", Order("o-3")
            )
            assert (created, again_created, again.id) == (True, False, run.id)
            waiter = asyncio.create_task(second())
            await waiting_on_a_lock(cyclone_env)
            assert not waiter.done()
        second_run, second_created = await asyncio.wait_for(waiter, 60)
    assert (second_run.id, second_created) == (run.id, False)


async def test_outside_a_transaction_is_refused(
    cyclone_env: CycloneEnv, engine: AsyncEngine
) -> None:
    async with AsyncSession(engine) as session, engine.connect() as conn:
        with pytest.raises(cyclone.NotInTransactionError, match="inside a transaction"):
            await ship.enqueue_tx(cyclone_env.client, session, Order("o-4"))
        with pytest.raises(cyclone.NotInTransactionError):
            await checkout.submit_tx(cyclone_env.client, conn, Order("o-4"))
        assert not session.in_transaction()  # refused without beginning one
    assert (await cyclone_env.client.list_runs()).runs == []


async def test_a_core_connection_writes_in_its_transaction(
    cyclone_env: CycloneEnv, engine: AsyncEngine
) -> None:
    async with engine.connect() as conn:
        await conn.begin()
        run = await ship.enqueue_tx(cyclone_env.client, conn, Order("core"))
        await conn.rollback()
    with pytest.raises(cyclone.RunNotFoundError):
        await run.status()


async def test_a_session_on_another_driver_is_refused(cyclone_env: CycloneEnv) -> None:
    psycopg_engine = create_async_engine(
        cyclone_env.dsn.replace("postgresql://", "postgresql+psycopg://")
    )
    try:
        async with AsyncSession(psycopg_engine) as session, session.begin():
            with pytest.raises(
                cyclone.InvalidInputError, match=r"postgresql\+psycopg; .*postgresql\+asyncpg://"
            ):
                await ship.enqueue_tx(cyclone_env.client, session, Order("o-5"))
    finally:
        await psycopg_engine.dispose()
