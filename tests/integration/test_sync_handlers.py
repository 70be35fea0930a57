"""Plain ``def`` handlers: run in threads under a limiter, with a usable context, a kept
lease, and attempts that end at once on timeout, cancel and shutdown."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import anyio.from_thread
import msgspec
import pytest

import cyclone
from cyclone.testing.plugin import CycloneEnv
from tests.conftest import Records, count_rows, fast_worker

WAIT = 30.0  # generous: every wait here ends on an event long before this


class Gate:
    """Thread-side events for handlers that block: each handler records that it entered,
    then waits for the test to open the gate."""

    def __init__(self) -> None:
        self.lock = threading.Condition()
        self.open = threading.Event()
        self.noticed = threading.Event()
        self.inside = 0
        self.most = 0
        self.calls = 0
        self.seen: list[Any] = []

    def enter(self) -> None:
        with self.lock:
            self.inside += 1
            self.calls += 1
            self.most = max(self.most, self.inside)
            self.lock.notify_all()

    def wait_inside(self, count: int) -> None:
        """Until ``count`` handlers are inside (call it in a thread)."""
        with self.lock:
            assert self.lock.wait_for(lambda: self.inside >= count, WAIT), self.inside

    def leave(self) -> None:
        with self.lock:
            self.inside -= 1


gate = Gate()


@pytest.fixture(autouse=True)
def fresh_gate() -> Any:
    global gate
    gate = Gate()
    yield
    gate.open.set()  # no thread of this test stays blocked


class Order(msgspec.Struct):
    cents: int


@cyclone.step("sync.price")
def price(ctx: cyclone.Context, order: Order) -> int:
    gate.seen.append((threading.current_thread() is threading.main_thread(), ctx.attempt))
    return order.cents * 2


@cyclone.step("sync.label")
def label(ctx: cyclone.Context, order: Order) -> str:
    priced = anyio.from_thread.run(ctx.output, "sync.price")  # the portal to the worker's loop
    conn = anyio.from_thread.run(ctx.completion_tx)
    anyio.from_thread.run(conn.execute, "INSERT INTO sync_effects (label) VALUES ('labelled')")
    return f"{ctx.node}: {priced}"


pricing = cyclone.define_result("sync.pricing", Order, str)
priced_node = pricing.node(price)
pricing.set_result(pricing.node(label, after=[priced_node]))


async def test_a_sync_step_runs_in_a_thread(cyclone_env: CycloneEnv) -> None:
    run = await price.enqueue(cyclone_env.client, Order(21))
    async with fast_worker(cyclone_env.client, steps=[price]):
        assert await run.result(timeout=WAIT) == 42
    assert gate.seen == [(False, 1)]


async def test_a_sync_node_reaches_its_context_through_the_portal(cyclone_env: CycloneEnv) -> None:
    await cyclone_env.pool.execute("CREATE TABLE sync_effects (label text)")
    run = await pricing.submit(cyclone_env.client, Order(5))
    async with fast_worker(cyclone_env.client, workflows=[pricing]):
        assert await run.result(timeout=WAIT) == "sync.label: 10"
    # The write on its completion transaction committed with the completion.
    assert await cyclone_env.pool.fetchval("SELECT count(*) FROM sync_effects") == 1


@cyclone.step("sync.blocking", queue="blocking")
def blocking(ctx: cyclone.Context, n: int) -> int:
    gate.enter()
    try:
        gate.open.wait(WAIT)
    finally:
        gate.leave()
    return n


async def test_the_limiter_caps_the_threads(cyclone_env: CycloneEnv, records: Records) -> None:
    runs = await blocking.enqueue_many(cyclone_env.client, [1, 2, 3])
    async with fast_worker(cyclone_env.client, steps=[blocking], queues={"blocking": 5}, threads=2):
        # All three claimed (slots for five), two in threads, the third waits for one.
        await records.wait_for("waits for a thread: all 2 are busy")
        await asyncio.to_thread(gate.wait_inside, 2)
        gate.open.set()
        assert [await r.result(timeout=WAIT) for r in runs] == [1, 2, 3]
    assert (gate.most, gate.calls) == (2, 3)


@cyclone.step("sync.sleepy", max_attempts=1)
def sleepy(ctx: cyclone.Context, seconds: float) -> int:
    gate.enter()
    time.sleep(seconds)  # blocks its thread; the event loop renews the lease meanwhile
    return ctx.attempt


async def test_a_blocking_handler_keeps_its_lease(cyclone_env: CycloneEnv) -> None:
    # Blocks for several leases: without heartbeats the task would be reclaimed.
    run = await sleepy.enqueue(cyclone_env.client, 2.0)
    async with fast_worker(cyclone_env.client, steps=[sleepy], lease=0.4):
        assert await run.result(timeout=WAIT) == 1
    node = (await run.info()).nodes[0]
    assert (node.state, node.attempts, node.errors) == ("completed", 1, [])
    assert gate.calls == 1


@cyclone.step("sync.stubborn", max_attempts=1, timeout=0.3)
def stubborn(ctx: cyclone.Context, n: int) -> int:
    gate.enter()
    while not ctx.cancelled:  # a long computation checking between its pieces
        gate.open.wait(0.01)
    gate.seen.append(ctx.cancelled)
    try:
        ctx.raise_if_cancelled()
    except asyncio.CancelledError as exc:
        gate.seen.append(type(exc).__name__)
    try:
        anyio.from_thread.run(ctx.output, "x")
    except cyclone.ContextError as exc:
        gate.seen.append(str(exc))
    gate.noticed.set()
    return n


async def test_a_sync_handler_times_out_at_once(cyclone_env: CycloneEnv) -> None:
    run = await stubborn.enqueue(cyclone_env.client, 1)
    async with fast_worker(cyclone_env.client, steps=[stubborn]):
        assert await run.wait(timeout=WAIT) is cyclone.RunState.FAILED
        assert await asyncio.to_thread(gate.noticed.wait, WAIT)
    node = (await run.info()).nodes[0]
    assert [e["type"] for e in node.errors] == ["Timeout"]
    assert gate.seen == [True, "CancelledError", "output() after the attempt was cancelled"]


@cyclone.step("sync.cancellable")
def cancellable(ctx: cyclone.Context, n: int) -> int:
    gate.enter()
    while not ctx.cancelled:
        gate.open.wait(0.01)
    gate.noticed.set()
    return n


async def test_cancelling_the_run_ends_a_blocked_attempt(
    cyclone_env: CycloneEnv, records: Records
) -> None:
    run = await cancellable.enqueue(cyclone_env.client, 1)
    async with fast_worker(cyclone_env.client, steps=[cancellable], lease=0.6) as worker:
        await asyncio.to_thread(gate.wait_inside, 1)
        assert await run.cancel()
        # The heartbeat sees the task gone, ends the attempt; the thread sees it and returns.
        assert await asyncio.to_thread(gate.noticed.wait, WAIT)
        await records.wait_for("its abandoned handler thread returned")
        await worker.idle()
    assert await run.status() is cyclone.RunState.CANCELLED
    assert await count_rows(cyclone_env, "cyclone_tasks") == 0


async def test_shutdown_hands_back_a_blocked_attempt(
    cyclone_env: CycloneEnv, records: Records
) -> None:
    run = await blocking.enqueue(cyclone_env.client, 7)
    worker = fast_worker(cyclone_env.client, steps=[blocking], queues={"blocking": 1})
    await worker.start()
    await asyncio.to_thread(gate.wait_inside, 1)
    await worker.stop(timeout=0.2)  # the thread is still blocked: the deadline holds anyway
    await records.wait_for("interrupted by shutdown; handed back to its queue")
    assert gate.inside == 1
    assert await run.status() is cyclone.RunState.PENDING
    gate.open.set()
    # Its thread returns into a stopped worker: the result is dropped, the task stays free.
    async with fast_worker(cyclone_env.client, steps=[blocking], queues={"blocking": 1}):
        assert await run.result(timeout=WAIT) == 7
    # Handed back by shutdown, the first attempt did not count; the handler ran twice.
    assert ((await run.info()).nodes[0].attempts, gate.calls) == (1, 2)
