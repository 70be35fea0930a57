"""Claiming ahead: a queue whose handlers are short claims tasks beyond its free slots, each
waiting for a slot, and sends its next claim before the last one's attempts start; no more
handlers than slots ever run, a stopping
worker hands back at once what it has not started, a task waiting too long goes back to its
queue, and a task lost while it waits never starts."""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

import cyclone
from cyclone._storage import queries as db
from cyclone._worker import ahead as _ahead
from cyclone._worker import attempt as _attempt
from cyclone.testing.plugin import CycloneEnv
from tests.conftest import fast_worker

SLOTS = 4
BLOCKING = 100  # inputs from here on wait for the gate


class Gate:
    """Which inputs ran, how many handlers ran at once, and the gate blocking ones wait on."""

    def __init__(self) -> None:
        self.open = asyncio.Event()
        self.calls: list[int] = []
        self.running = 0
        self.most = 0
        self.pause = 0.0  # seconds each handler below BLOCKING takes
        self.watch: Callable[[], None] = lambda: None  # called as each handler starts

    async def enter(self, n: int) -> None:
        self.watch()
        self.calls.append(n)
        self.running += 1
        self.most = max(self.most, self.running)
        try:
            if n >= BLOCKING:
                await self.open.wait()
            elif self.pause:
                await asyncio.sleep(self.pause)
        finally:
            self.running -= 1


gate = Gate()


@cyclone.step("ahead.work", queue="ahead")
async def work(ctx: cyclone.Context, n: int) -> int:
    await gate.enter(n)
    return n


@pytest.fixture
def env(cyclone_env: CycloneEnv, monkeypatch: pytest.MonkeyPatch) -> CycloneEnv:
    global gate
    gate = Gate()
    # However slow the machine, what was claimed ahead waits until the test lets it go.
    monkeypatch.setattr(_attempt, "AHEAD_WAIT", 3600.0)
    return cyclone_env


async def tasks(env: CycloneEnv, state: str, *, attempt: int | None = None) -> int:
    n: int = await env.pool.fetchval(
        "SELECT count(*) FROM cyclone_tasks WHERE state = $1 AND ($2::int IS NULL OR attempt = $2)",
        state,
        attempt,
    )
    return n


async def until(check: Callable[[], Awaitable[bool]], what: str) -> None:
    """Poll ``check`` until it holds (the database's or the handlers' state: no event)."""
    try:
        async with asyncio.timeout(60):
            while not await check():  # noqa: ASYNC110 - state of other sessions and tasks
                await asyncio.sleep(0.02)
    except TimeoutError:
        raise AssertionError(f"no {what} within 60 s") from None


async def warmed_then_blocked(env: CycloneEnv, worker: cyclone.Worker) -> list[uuid.UUID]:
    """Short handlers first (so the queue counts as short), then twice SLOTS blocking ones
    in one enqueue; returns the blocking runs' ids once SLOTS of them run."""
    await work.enqueue_many(env.client, list(range(2 * SLOTS)))
    await asyncio.wait_for(worker.drain(), 60)
    runs = await work.enqueue_many(env.client, list(range(BLOCKING, BLOCKING + 2 * SLOTS)))

    async def slots_busy() -> bool:
        return gate.running == SLOTS

    await until(slots_busy, "every slot running a blocking handler")
    return [r.id for r in runs]


async def test_short_handlers_claim_ahead_and_never_run_more_than_their_slots(
    env: CycloneEnv,
) -> None:
    async with fast_worker(env.client, steps=[work], queues={"ahead": SLOTS}) as worker:
        await warmed_then_blocked(env, worker)

        async def claimed_ahead() -> bool:
            return await tasks(env, "running") == 2 * SLOTS

        # One task ahead per slot: leased, counted as running, not started.
        await until(claimed_ahead, "the tasks claimed ahead")
        assert gate.running == SLOTS
        gate.open.set()
        await asyncio.wait_for(worker.drain(), 60)
    assert gate.most == SLOTS
    assert sorted(gate.calls) == list(range(2 * SLOTS)) + list(
        range(BLOCKING, BLOCKING + 2 * SLOTS)
    )


@pytest.mark.parametrize("claim_ahead", [True, False])
async def test_claim_ahead_off_claims_only_for_free_slots(
    env: CycloneEnv, monkeypatch: pytest.MonkeyPatch, claim_ahead: bool
) -> None:
    """With ``claim_ahead=False`` no claim asks for more tasks than the queue has slots,
    however short its handlers; on (the default), the same drains claim ahead."""
    limits: list[int] = []
    plain = db.task_claim_plain

    async def recorded(*args: Any) -> db.ClaimedRows:
        limits.append(args[2].limit)  # (conn, queries, request)
        return await plain(*args)

    monkeypatch.setattr(db, "task_claim_plain", recorded)
    options: dict[str, Any] = {"queues": {"ahead": SLOTS}, "claim_ahead": claim_ahead}
    async with fast_worker(env.client, steps=[work], **options) as worker:
        for _ in range(3):
            await work.enqueue_many(env.client, list(range(8 * SLOTS)))
            await asyncio.wait_for(worker.drain(), 60)
    assert len(gate.calls) == 24 * SLOTS
    assert gate.most <= SLOTS
    assert (max(limits) > SLOTS) is claim_ahead, limits


async def test_long_handlers_claim_nothing_ahead(
    env: CycloneEnv, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_ahead, "AHEAD_BELOW", 0.01)
    gate.pause = 0.05  # each warm-up handler takes longer than AHEAD_BELOW
    async with fast_worker(env.client, steps=[work], queues={"ahead": SLOTS}) as worker:
        await warmed_then_blocked(env, worker)
        # A negative: no event tells that a claim ahead did not happen, so give the worker
        # a few polls (and wakeups) to make one.
        await asyncio.sleep(0.5)
        assert await tasks(env, "running") == SLOTS
        assert await tasks(env, "available") == SLOTS
        gate.open.set()
        await asyncio.wait_for(worker.drain(), 60)
    assert gate.most == SLOTS


async def test_a_stopping_worker_hands_back_at_once_what_it_claimed_ahead(
    env: CycloneEnv,
) -> None:
    worker = fast_worker(env.client, steps=[work], queues={"ahead": SLOTS}, shutdown_timeout=60)
    await worker.start()
    try:
        await warmed_then_blocked(env, worker)

        async def claimed_ahead() -> bool:
            return await tasks(env, "running") == 2 * SLOTS

        await until(claimed_ahead, "the tasks claimed ahead")
        stopping = asyncio.create_task(worker.stop())

        async def handed_back() -> bool:  # available again, their attempt refunded
            return await tasks(env, "available", attempt=0) == SLOTS

        await until(handed_back, "the tasks claimed ahead handed back")
        # ...while the handlers that started still run, within the shutdown timeout.
        assert await tasks(env, "running") == SLOTS
        assert gate.running == SLOTS
        assert not stopping.done()
        gate.open.set()
        await asyncio.wait_for(stopping, 60)
    finally:
        gate.open.set()
        await worker.stop()
    started = [n for n in gate.calls if n >= BLOCKING]
    assert len(started) == SLOTS  # the others never ran here
    assert await tasks(env, "available", attempt=0) == SLOTS
    assert await tasks(env, "running") == 0


async def test_a_task_claimed_ahead_whose_run_is_cancelled_never_starts(
    env: CycloneEnv, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="cyclone")
    async with fast_worker(env.client, steps=[work], queues={"ahead": SLOTS}) as worker:
        runs = await warmed_then_blocked(env, worker)

        async def claimed_ahead() -> bool:
            return await tasks(env, "running") == 2 * SLOTS

        await until(claimed_ahead, "the tasks claimed ahead")
        started = {n - BLOCKING for n in gate.calls if n >= BLOCKING}
        waiting = next(i for i in range(2 * SLOTS) if i not in started)
        assert await (await env.client.get_run(runs[waiting])).cancel()

        async def dropped() -> bool:  # the heartbeat found its task gone
            return any("its run is cancelled" in r.getMessage() for r in caplog.records)

        await until(dropped, "the lease keeper dropping the cancelled task")
        gate.open.set()
        await asyncio.wait_for(worker.drain(), 60)
        # The worker goes on: more work runs in the slot the cancelled task never took.
        await work.enqueue(env.client, 1)
        await asyncio.wait_for(worker.drain(), 60)
    assert BLOCKING + waiting not in gate.calls
    assert sorted(n for n in gate.calls if n >= BLOCKING) == sorted(
        BLOCKING + i for i in range(2 * SLOTS) if i != waiting
    )
    assert gate.most == SLOTS


async def test_tasks_waiting_too_long_go_back_and_nothing_more_is_claimed_ahead(
    env: CycloneEnv, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The handlers in the slots were not short after all: after AHEAD_WAIT, what waits for
    a slot is handed back to other workers (attempt given back), and not claimed ahead again
    while the queue's handlers are known to be long."""
    monkeypatch.setattr(_attempt, "AHEAD_WAIT", 0.3)
    async with fast_worker(env.client, steps=[work], queues={"ahead": SLOTS}) as worker:
        await warmed_then_blocked(env, worker)

        async def handed_back() -> bool:
            return await tasks(env, "available", attempt=0) == SLOTS

        await until(handed_back, "the tasks claimed ahead handed back after AHEAD_WAIT")
        assert gate.running == SLOTS and await tasks(env, "running") == SLOTS
        # A negative: give the worker a few polls to claim them ahead again.
        await asyncio.sleep(0.5)
        assert await tasks(env, "available", attempt=0) == SLOTS
        gate.open.set()
        await asyncio.wait_for(worker.drain(), 60)
    assert sorted(n for n in gate.calls if n >= BLOCKING) == list(
        range(BLOCKING, BLOCKING + 2 * SLOTS)
    )
    assert gate.most == SLOTS


async def test_a_claim_in_flight_at_stop_hands_back_what_it_took_ahead(
    env: CycloneEnv, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The claim comes back after stop() began: its tasks beyond the free slots are handed
    back at once (they never start), the others run, and the worker ends idle with no task
    left leased to it."""
    worker = fast_worker(env.client, steps=[work], queues={"ahead": SLOTS}, shutdown_timeout=60)
    await worker.start()
    held, back = asyncio.Event(), asyncio.Event()
    claim = db.task_claim_plain

    async def claim_held_at_return(*args: Any) -> db.ClaimedRows:
        rows = await claim(*args)
        if len(rows) == 2 * SLOTS:  # the claim of the blocking ones: wait for the test
            held.set()
            await back.wait()
        return rows

    try:
        await work.enqueue_many(env.client, list(range(2 * SLOTS)))
        await asyncio.wait_for(worker.drain(), 60)  # the queue's handlers are short
        monkeypatch.setattr(db, "task_claim_plain", claim_held_at_return)
        await work.enqueue_many(env.client, list(range(BLOCKING, BLOCKING + 2 * SLOTS)))
        await asyncio.wait_for(held.wait(), 60)
        stopping = asyncio.create_task(worker.stop())
        await asyncio.sleep(0)  # stop() has begun: the producers are stopping
        back.set()

        async def handed_back() -> bool:
            return await tasks(env, "available", attempt=0) == SLOTS

        await until(handed_back, "the tasks claimed ahead handed back")
        assert gate.running == SLOTS
        gate.open.set()
        await asyncio.wait_for(stopping, 60)
        await asyncio.wait_for(worker.idle(), 10)  # no attempt is left held
    finally:
        back.set()
        gate.open.set()
        await worker.stop()
    assert len([n for n in gate.calls if n >= BLOCKING]) == SLOTS
    assert await tasks(env, "available", attempt=0) == SLOTS
    assert await tasks(env, "running") == 0


async def test_a_limit_set_while_tasks_wait_ahead_gets_them_back(env: CycloneEnv) -> None:
    """Tasks claimed ahead before the queue was limited go back to it at the worker's next
    claim, which finds the limit, instead of starting in slots the limit does not allow."""
    slots = 2
    # Fewer than the worker may hold ahead: room is left, so the next poll claims.
    quick = list(range(10, 10 + _ahead.most_ahead(slots) - slots))
    async with fast_worker(env.client, steps=[work], queues={"ahead": slots}) as worker:
        await work.enqueue_many(env.client, list(range(2 * slots)))
        await asyncio.wait_for(worker.drain(), 60)  # the queue's handlers are short
        # However loaded the machine was for those, the whole allowance (it failed once
        # with the cores busy: a slower pace allowed fewer ahead than the quick ones).
        worker._producers["ahead"]._pace.mean = 1e-6
        # The blocking ones first: they take the slots, the quick ones wait ahead.
        await work.enqueue_many(env.client, [BLOCKING, BLOCKING + 1, *quick])

        async def waiting_ahead() -> bool:
            return gate.running == slots and await tasks(env, "available") == 0

        await until(waiting_ahead, "the quick tasks claimed ahead")
        await env.client.queues.set_limits("ahead", concurrency=1)

        async def handed_back() -> bool:  # by the next poll's claim, which declines
            return await tasks(env, "available", attempt=0) == len(quick)

        await until(handed_back, "the tasks claimed ahead handed back to the limited queue")
        assert gate.running == slots  # the blocking ones still run
        gate.open.set()
        await asyncio.wait_for(worker.drain(), 60)
    assert sorted(gate.calls) == sorted([*range(2 * slots), BLOCKING, BLOCKING + 1, *quick])


async def test_the_next_claim_is_in_flight_while_the_last_ones_attempts_run(
    env: CycloneEnv, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Handlers that do not wait run a claim's attempts one after another in one pass of
    the event loop (each freed slot starts the next task claimed ahead). Once a slot's
    worth of room is free, the next claim goes out at once and travels while the rest of
    them run; sent by the producer's own pass, it would go out only once they had all run."""
    # The first claim takes what the caps allow, however slow this machine's no-op handlers
    # (the span would bind above a mean of 0.3 ms): the caps are what these counts assume.
    monkeypatch.setattr(_ahead, "AHEAD_SPAN", 1.0)
    async with fast_worker(env.client, steps=[work], queues={"ahead": SLOTS}) as worker:
        await work.enqueue_many(env.client, list(range(2 * SLOTS)))  # the queue counts as short
        await asyncio.wait_for(worker.drain(), 60)
        producer = worker._producers["ahead"]
        in_flight: list[bool] = []
        gate.watch = lambda: in_flight.append(bool(producer._claims))
        first = SLOTS + _ahead.most_ahead(SLOTS)  # what the first claim takes
        await work.enqueue_many(env.client, [0] * (2 * first))  # none blocking
        await asyncio.wait_for(worker.drain(), 60)
    assert len(in_flight) == 2 * first
    # The first SLOTS attempts free the room for the next claim (SLOTS tasks: the first
    # claim took all the queue holds); every later attempt of the first claim runs with
    # the next claim in flight.
    assert all(in_flight[SLOTS:first]), in_flight[:first]


async def test_a_claim_cancelled_before_it_starts_leaks_nothing(env: CycloneEnv) -> None:
    """A claim task cancelled before its first step never runs its body: what it reserved
    is given back all the same, and the queue goes on claiming (a claim that stayed counted
    as in flight would stop every later one)."""
    async with fast_worker(env.client, steps=[work], queues={"ahead": SLOTS}) as worker:
        producer = worker._producers["ahead"]
        await asyncio.wait_for(worker.drain(), 60)

        async def no_claim_in_flight() -> bool:  # a poll's claim may be
            return not producer._claims

        await until(no_claim_in_flight, "a moment with no claim in flight")
        assert producer._start_claims()  # in the same pass: nothing ran in between
        claims = list(producer._claims)
        for task in claims:
            task.cancel()
        await asyncio.wait(claims)
        await asyncio.sleep(0)  # the tasks' done callbacks
        assert not producer._claims and producer._reserved == 0
        run = await work.enqueue(env.client, 1)
        assert await run.result(timeout=30) == 1


async def test_a_claim_ahead_whose_connection_dies_leaves_nothing_behind(
    env: CycloneEnv, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The claim that goes out while tasks claimed ahead wait loses its connection under
    its statement: it claimed nothing, its reservation is given back, the queue claims
    again, and every job runs once, on its first attempt."""
    # The first claim takes what the caps allow, however slow this machine's no-op handlers
    # (the span would bind above a mean of 0.3 ms): the caps are what these counts assume.
    monkeypatch.setattr(_ahead, "AHEAD_SPAN", 1.0)
    async with fast_worker(env.client, steps=[work], queues={"ahead": SLOTS}) as worker:
        await work.enqueue_many(env.client, list(range(2 * SLOTS)))  # the queue counts as short
        await asyncio.wait_for(worker.drain(), 60)
        first = SLOTS + _ahead.most_ahead(SLOTS)  # what the first claim takes
        # One kill, at a row of the claim after the first (sent while the first one's tasks
        # run): the sequence is not transactional, so the rollback does not re-arm it.
        await env.pool.execute(
            "CREATE SEQUENCE claimed_rows;"
            "CREATE FUNCTION kill_at() RETURNS trigger LANGUAGE plpgsql AS $$"
            " BEGIN IF nextval('claimed_rows') = TG_ARGV[0]::int THEN"
            "   PERFORM pg_terminate_backend(pg_backend_pid()); PERFORM pg_sleep(5); END IF;"
            " RETURN NEW; END $$;"
            "CREATE TRIGGER kill_claim BEFORE UPDATE ON cyclone_tasks FOR EACH ROW"
            " WHEN (OLD.state = 'available' AND NEW.state = 'running')"
            f" EXECUTE FUNCTION kill_at('{first + 2}')"
        )
        gate.calls.clear()
        await work.enqueue_many(env.client, [0] * (3 * first))  # none blocking
        await asyncio.wait_for(worker.drain(), 60)
        producer = worker._producers["ahead"]
        assert producer._reserved == 0 and not producer._slots.waiting
    killed = await env.pool.fetchval("SELECT last_value FROM claimed_rows")
    assert killed > first + 2  # the kill happened, and claims went on after it
    assert len(gate.calls) == 3 * first  # each job ran once
    attempts = await env.pool.fetch(
        "SELECT state, attempts, count(*) FROM cyclone_runs GROUP BY state, attempts"
    )
    runs = 2 * SLOTS + 3 * first  # the warm-up's too
    assert [tuple(r) for r in attempts] == [("completed", 1, runs)]


async def test_a_wakeup_that_finds_no_room_claims_once_slots_free(env: CycloneEnv) -> None:
    """A wakeup that comes while every slot runs and the tasks claimed ahead fill the
    allowance claims nothing then (claims ahead go out whole, not one by one), but as soon as
    slots free, not at the next poll (an hour away here). The burst claimed ahead came back
    short of its room, so no full claim asks for the next one either: the old code left the
    new job to the poll."""
    options: dict[str, Any] = {"queues": {"ahead": SLOTS}, "poll_interval": 3600.0}
    async with fast_worker(env.client, steps=[work], **options) as worker:
        await work.enqueue_many(env.client, list(range(2 * SLOTS)))  # the queue's pace
        await asyncio.wait_for(worker.drain(), 60)
        producer = worker._producers["ahead"]
        producer._pace.mean = 1e-6  # as short as handlers get: the whole allowance
        most = _ahead.most_ahead(SLOTS)
        # One claim takes the burst whole, two short of its room (the slots and the
        # allowance): every slot runs a blocking handler, the rest wait for one.
        await work.enqueue_many(env.client, list(range(BLOCKING, BLOCKING + SLOTS + most - 2)))

        async def claimed() -> bool:
            return gate.running == SLOTS and producer._slots.waiting == most - 2

        await until(claimed, "the burst claimed, every slot running")
        # A job whose wakeup comes now (committed without one, then woken by hand, as a
        # NOTIFY would): room for two, less than a claim ahead takes, so no claim.
        async with env.pool.acquire() as conn, conn.transaction():
            late = await work.enqueue_tx(env.client, conn, 7)
        producer.wake()
        async with asyncio.timeout(30):
            while producer._wake.is_set():  # noqa: ASYNC110 - the producer's own pass
                await asyncio.sleep(0)
        assert not producer._claims
        gate.open.set()
        assert await late.result(timeout=30) == 7
