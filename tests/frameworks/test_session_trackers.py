"""Wakeup trackers on a SQLAlchemy session: each covers the block it was set for, and a later
``client.transaction(session)`` or ``track_wakeups`` on the same session has its own."""

from __future__ import annotations

import ast
import asyncio
from collections.abc import AsyncIterator
from typing import Any

import msgspec
import psycopg_pool
import pytest
import pytest_asyncio
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, create_async_engine
from sqlalchemy.orm import Session

import cyclone
import cyclone.sync
from cyclone.testing.plugin import CycloneEnv
from tests.conftest import ROOT, DocBlock, Listener, doc_blocks, fast_worker
from tests.frameworks.conftest import Order, SyncListener, audit, ship


class Receipt(msgspec.Struct):
    order_id: int


@cyclone.step("integrations.receipt", queue="receipts")
async def send_receipt(ctx: cyclone.Context, receipt: Receipt) -> None:
    """The docs' ``send_receipt``, with a handler for the worker."""


@pytest_asyncio.fixture
async def engine(cyclone_env: CycloneEnv) -> AsyncIterator[AsyncEngine]:
    made = create_async_engine(cyclone_env.dsn.replace("postgresql://", "postgresql+asyncpg://"))
    try:
        yield made
    finally:
        await made.dispose()


def tracker_blocks() -> tuple[DocBlock, DocBlock]:
    """The two blocks of docs/integrations.md that track a session, then use
    ``client.transaction`` on the same session."""
    blocks = doc_blocks(ROOT / "docs" / "integrations.md")
    at = next(i for i, b in enumerate(blocks) if "cyclone.track_wakeups(session)" in b.code)
    first, second = blocks[at], blocks[at + 1]
    assert "client.transaction(session)" in second.code
    return first, second


async def run_block(block: DocBlock, ns: dict[str, Any]) -> None:
    code = compile(block.code, "docs/integrations.md", "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
    await eval(code, ns)


async def settled(producer: Any) -> None:
    """Until the producer's claims are back and it has had every wakeup so far: from here it
    claims only when woken or at its poll (tests/integration/test_worker.py has the same)."""
    async with asyncio.timeout(30):
        while producer._claims or producer._wake.is_set():
            if producer._claims:
                await asyncio.wait(set(producer._claims))
            else:
                await asyncio.sleep(0)  # the producer's pass, which clears the wakeup


async def woken(listener: Listener, count: int) -> dict[str, int]:
    """The wakeups, once ``count`` arrived (a session's commit publishes in the background)
    and everything sent before now was delivered."""
    async with asyncio.timeout(30):
        while len(listener.payloads) < count:
            listener.arrived.clear()
            await listener.arrived.wait()
    await listener.settle()
    return dict(listener.counts())


async def test_the_docs_sequence_wakes_a_worker_long_before_its_poll(
    cyclone_env: CycloneEnv, engine: AsyncEngine
) -> None:
    client = cyclone_env.client
    first, second = tracker_blocks()
    ns: dict[str, Any] = {
        "cyclone": cyclone,
        "client": client,
        "engine": engine,
        "AsyncSession": AsyncSession,
        "Receipt": Receipt,
        "send_receipt": send_receipt,
    }
    async with fast_worker(client, steps=[send_receipt], poll_interval=30) as worker:
        await asyncio.wait_for(client.services.notifier.connected.wait(), 30)
        producer = worker._producers["receipts"]
        await settled(producer)
        await run_block(first, ns)
        # 10 s is generous for a wakeup, and far from the poll 30 s away.
        assert await ns["run"].wait(timeout=10) is cyclone.RunState.COMPLETED
        await settled(producer)
        # The session, reused: only the wakeup of this block's commit can start its job.
        await run_block(second, ns)
        assert await ns["run"].wait(timeout=10) is cyclone.RunState.COMPLETED
        assert worker.poll_interval == 30


async def test_client_transaction_inside_a_tracked_transaction_keeps_its_own(
    cyclone_env: CycloneEnv, engine: AsyncEngine, listener: Listener
) -> None:
    client = cyclone_env.client
    async with AsyncSession(engine) as session:
        ttx, wakeups = cyclone.track_wakeups(session)
        async with session.begin():
            await ship.enqueue_tx(client, ttx, Order("tracked"))
            async with client.transaction(session) as tx:  # a savepoint: the innermost
                await audit.enqueue_tx(client, tx, Order("in the block"))
            assert await woken(listener, 0) == {}  # nothing before the outer commit
        assert list(wakeups) == ["ship"]
        assert await woken(listener, 1) == {"q:audit": 1}
        await client.publish_wakeups(wakeups)
    assert await woken(listener, 2) == {"q:audit": 1, "q:ship": 1}


async def test_track_wakeups_inside_client_transaction_takes_what_follows(
    cyclone_env: CycloneEnv, engine: AsyncEngine, listener: Listener
) -> None:
    client = cyclone_env.client
    async with AsyncSession(engine) as session:
        async with client.transaction(session) as tx:
            await audit.enqueue_tx(client, tx, Order("before"))
            ttx, wakeups = cyclone.track_wakeups(session)
            await ship.enqueue_tx(client, ttx, Order("after"))
        assert list(wakeups) == ["ship"]
        assert await woken(listener, 1) == {"q:audit": 1}


async def test_a_tracker_ends_with_its_transaction_committed_or_rolled_back(
    cyclone_env: CycloneEnv, engine: AsyncEngine, listener: Listener
) -> None:
    client = cyclone_env.client
    async with AsyncSession(engine) as session:  # one session, as across requests
        ttx, rolled_back = cyclone.track_wakeups(session)
        with pytest.raises(ZeroDivisionError):
            async with session.begin():
                await ship.enqueue_tx(client, ttx, Order("dropped"))
                1 / 0  # noqa: B018
        assert not rolled_back
        # The next request: a plain transaction, published at its commit.
        async with session.begin():
            await audit.enqueue_tx(client, session, Order("plain"))
        assert await woken(listener, 1) == {"q:audit": 1}
        ttx, committed = cyclone.track_wakeups(session)
        async with session.begin():
            await ship.enqueue_tx(client, ttx, Order("tracked"))
        assert list(committed) == ["ship"]
        # And again: the tracker of the committed transaction takes no more.
        async with session.begin():
            await ship.enqueue_tx(client, session, Order("plain again"))
        assert list(committed) == ["ship"]
        assert await woken(listener, 2) == {"q:audit": 1, "q:ship": 1}
        # A client.transaction block that rolls back drops its wakeups too.
        with pytest.raises(ZeroDivisionError):
            async with client.transaction(session) as tx:
                await audit.enqueue_tx(client, tx, Order("dropped too"))
                1 / 0  # noqa: B018
        assert await woken(listener, 2) == {"q:audit": 1, "q:ship": 1}


async def test_a_tracker_set_in_an_open_transaction_covers_that_one(
    cyclone_env: CycloneEnv, engine: AsyncEngine, listener: Listener
) -> None:
    client = cyclone_env.client
    async with AsyncSession(engine) as session:
        await session.execute(sa.text("SELECT 1"))  # autobegin
        ttx, wakeups = cyclone.track_wakeups(session)
        await ship.enqueue_tx(client, ttx, Order("autobegun"))
        await session.commit()
        assert list(wakeups) == ["ship"]
        async with session.begin():
            await audit.enqueue_tx(client, session, Order("next"))
        assert list(wakeups) == ["ship"]
    assert await woken(listener, 1) == {"q:audit": 1}


def test_sync_session_tracked_then_client_transaction(
    cyclone_env: CycloneEnv, sync_listener: SyncListener
) -> None:
    engine = sa.create_engine(cyclone_env.dsn.replace("postgresql://", "postgresql+psycopg://"))
    try:
        with psycopg_pool.ConnectionPool(cyclone_env.dsn, min_size=1, open=True) as pool:
            client = cyclone.sync.Client(pool)
            with Session(engine) as session:
                ttx, wakeups = cyclone.track_wakeups(session)
                with session.begin():
                    client.enqueue_tx(ttx, ship, Order("tracked"))
                assert list(wakeups) == ["ship"]
                client.publish_wakeups(wakeups)
                assert sync_listener.settle() == {"q:ship": 1}
                with client.transaction(session) as tx:
                    client.enqueue_tx(tx, audit, Order("in client.transaction"))
                assert not wakeups
                assert sync_listener.settle() == {"q:audit": 1}
    finally:
        engine.dispose()
