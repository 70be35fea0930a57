"""The worker: claim, complete, retry, snooze, timeout, cancel, priorities, limits, shutdown."""

from __future__ import annotations

import asyncio
import contextvars
import datetime as dt
from typing import Any

import asyncpg
import pytest

import cyclone
from cyclone._storage import queries as db
from cyclone.testing.plugin import CycloneEnv
from tests.conftest import Probe, count_rows, fast_worker


@cyclone.step("double")
async def double(ctx: cyclone.Context, n: int) -> int:
    return n * 2


async def test_worker_completes_jobs_with_typed_output(cyclone_env: CycloneEnv) -> None:
    client = cyclone_env.client
    runs = await double.enqueue_many(client, list(range(30)))
    async with fast_worker(client, steps=[double]):
        results = [await r.result(timeout=30) for r in runs]
    assert results == [n * 2 for n in range(30)]
    assert await count_rows(cyclone_env, "cyclone_tasks") == 0  # finished work leaves the hot table
    info = await runs[0].info()
    assert info.state is cyclone.RunState.COMPLETED
    assert info.finished_at is not None
    assert [(n.state, n.attempts) for n in info.nodes] == [("completed", 1)]


class Flaky:
    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.calls = 0


flaky_state = Flaky(0)


@cyclone.step("flaky", max_attempts=3)
async def flaky(ctx: cyclone.Context, n: int) -> int:
    flaky_state.calls += 1
    if flaky_state.calls <= flaky_state.failures:
        raise ValueError(f"boom {flaky_state.calls}")
    return ctx.attempt


async def test_retries_keep_every_attempts_error(cyclone_env: CycloneEnv) -> None:
    global flaky_state
    flaky_state = Flaky(failures=2)
    run = await flaky.enqueue(cyclone_env.client, 1)
    async with fast_worker(cyclone_env.client, steps=[flaky]):
        assert await run.result(timeout=30) == 3
    node = (await run.info()).nodes[0]
    assert node.attempts == 3
    assert [(e["attempt"], e["type"], e["message"]) for e in node.errors] == [
        (1, "ValueError", "boom 1"),
        (2, "ValueError", "boom 2"),
    ]
    assert "raise ValueError" in node.errors[0]["traceback"]


async def test_exhausted_attempts_fail_the_run(cyclone_env: CycloneEnv) -> None:
    global flaky_state
    flaky_state = Flaky(failures=10)
    run = await flaky.enqueue(cyclone_env.client, 1)
    async with fast_worker(cyclone_env.client, steps=[flaky]):
        assert await run.wait(timeout=30) is cyclone.RunState.FAILED
    with pytest.raises(cyclone.RunFailedError) as raised:
        await run.result()
    assert raised.value.error["message"] == "boom 3"
    info = await run.info()
    assert info.error is not None and info.error["type"] == "ValueError"
    assert [e["attempt"] for e in info.nodes[0].errors] == [1, 2, 3]
    assert flaky_state.calls == 3
    assert await count_rows(cyclone_env, "cyclone_tasks") == 0


@cyclone.step("nul_error", max_attempts=1)
async def fails_with_a_nul(ctx: cyclone.Context, n: int) -> None:
    raise RuntimeError("fails\x00with a NUL")


async def test_a_nul_in_an_error_is_recorded(cyclone_env: CycloneEnv) -> None:
    run = await fails_with_a_nul.enqueue(cyclone_env.client, 1)
    await cyclone_env.drain(steps=[fails_with_a_nul])  # no lease expiry needed to record it
    info = await run.info()
    assert info.state is cyclone.RunState.FAILED
    assert info.nodes[0].errors[0]["message"] == "fails\ufffdwith a NUL"


def test_backoff_grows_and_is_capped() -> None:
    delays = [cyclone.exponential_backoff(a, base=1, cap=100) for a in range(1, 12)]
    assert all(
        0.5 * min(100, 2 ** (a - 1)) <= d <= min(100, 2 ** (a - 1))
        for a, d in zip(range(1, 12), delays, strict=True)
    )


snoozes: list[int] = []


@cyclone.step("snoozer", max_attempts=1)
async def snoozer(ctx: cyclone.Context, n: int) -> int:
    snoozes.append(ctx.attempt)
    if len(snoozes) <= n:
        raise cyclone.Snooze(0.01)
    return len(snoozes)


async def test_snooze_does_not_spend_an_attempt(cyclone_env: CycloneEnv) -> None:
    snoozes.clear()
    run = await snoozer.enqueue(cyclone_env.client, 3)
    async with fast_worker(cyclone_env.client, steps=[snoozer]):
        assert await run.result(timeout=30) == 4
    assert snoozes == [1, 1, 1, 1]  # max_attempts=1, yet it ran four times
    assert (await run.info()).nodes[0].errors == []


@cyclone.step("sleepy", max_attempts=2, timeout=0.2)
async def sleepy(ctx: cyclone.Context, seconds: float) -> str:
    await asyncio.sleep(seconds)
    return "woke"


async def test_timeout_cancels_the_handler_and_spends_an_attempt(cyclone_env: CycloneEnv) -> None:
    run = await sleepy.enqueue(cyclone_env.client, 60.0)
    async with fast_worker(cyclone_env.client, steps=[sleepy]):
        assert await run.wait(timeout=30) is cyclone.RunState.FAILED
    errors = (await run.info()).nodes[0].errors
    assert [e["type"] for e in errors] == ["Timeout", "Timeout"]


stubborn_probe = Probe()


@cyclone.step("stubborn", queue="slow")
async def stubborn(ctx: cyclone.Context, n: int) -> int:
    stubborn_probe.started.set()
    try:
        await asyncio.sleep(3600)
    except Exception as exc:  # a handler that swallows errors cannot swallow cancellation
        stubborn_probe.calls.append(repr(exc))
    finally:
        stubborn_probe.stopped.set()
    return n


async def test_cancel_stops_a_running_handler(cyclone_env: CycloneEnv) -> None:
    stubborn_probe.reset()
    run = await stubborn.enqueue(cyclone_env.client, 1)
    async with fast_worker(cyclone_env.client, steps=[stubborn], lease=0.6):
        await asyncio.wait_for(stubborn_probe.started.wait(), 30)
        assert await run.status() is cyclone.RunState.RUNNING
        assert await run.cancel()
        assert await run.wait(timeout=30) is cyclone.RunState.CANCELLED
        # The heartbeat (a third of the lease) notices the task is gone and cancels it.
        await asyncio.wait_for(stubborn_probe.stopped.wait(), 30)
    assert stubborn_probe.calls == []
    assert not await run.cancel()  # already ended


async def test_cancelling_a_job_keeps_its_attempts(cyclone_env: CycloneEnv) -> None:
    run = await double.enqueue(cyclone_env.client, 1)
    await cyclone_env.pool.execute(
        """UPDATE cyclone_tasks SET attempt = 2, errors = '[{"attempt": 1}]'"""
    )
    assert await run.cancel()
    node = (await run.info()).nodes[0]
    assert (node.state, node.attempts, node.errors) == ("cancelled", 2, [{"attempt": 1}])


order_seen: list[int] = []


@cyclone.step("ordered", queue="one")
async def ordered(ctx: cyclone.Context, n: int) -> None:
    order_seen.append(n)


async def test_priority_then_time_then_enqueue_order(cyclone_env: CycloneEnv) -> None:
    order_seen.clear()
    client = cyclone_env.client
    await ordered.enqueue_many(client, [1, 2])
    await ordered.enqueue(client, 3, priority=10)
    await ordered.enqueue(client, 4, priority=-1)
    later = await ordered.enqueue(client, 5, process_in=3600)
    last = await ordered.enqueue(client, 6, priority=-1)
    async with fast_worker(client, steps=[ordered], queues={"one": 1}, claim_batch=1):
        await last.wait(timeout=30)
        assert await later.status() is cyclone.RunState.PENDING
    assert order_seen == [3, 1, 2, 4, 6]


concurrent_now = 0
concurrent_peak = 0


@cyclone.step("limited", queue="narrow")
async def limited(ctx: cyclone.Context, n: int) -> None:
    global concurrent_now, concurrent_peak
    concurrent_now += 1
    concurrent_peak = max(concurrent_peak, concurrent_now)
    await asyncio.sleep(0.02)
    concurrent_now -= 1


async def test_queue_concurrency_limit(cyclone_env: CycloneEnv) -> None:
    global concurrent_peak
    concurrent_peak = 0
    runs = await limited.enqueue_many(cyclone_env.client, list(range(40)))
    async with fast_worker(cyclone_env.client, steps=[limited], queues={"narrow": 3}):
        for run in runs:
            await run.wait(timeout=30)
    assert concurrent_peak == 3


async def test_worker_ignores_kinds_it_does_not_serve(cyclone_env: CycloneEnv) -> None:
    other = cyclone.register_kind("served.elsewhere", int, int)
    foreign = await other.enqueue(cyclone_env.client, 1)
    mine = await double.enqueue(cyclone_env.client, 1)
    async with fast_worker(cyclone_env.client, steps=[double]):
        await mine.wait(timeout=30)
    assert await foreign.status() is cyclone.RunState.PENDING


async def test_notification_wakes_the_worker_before_the_poll(cyclone_env: CycloneEnv) -> None:
    client = cyclone_env.client
    async with fast_worker(client, steps=[double], poll_interval=3600) as worker:
        await asyncio.wait_for(client.services.notifier.connected.wait(), 30)
        run = await double.enqueue(client, 21)
        assert await run.result(timeout=60) == 42
        # The first job may have been found by the claims the worker makes as it starts and
        # as the listener connects. Now its producer waits with an hour to its next poll:
        # only the NOTIFY of this enqueue can wake it.
        run = await double.enqueue(client, 50)
        assert await run.result(timeout=60) == 100
        assert worker.poll_interval == 3600


async def settled(producer: Any) -> None:
    """Until the claims the worker made as it started are back, and its producer's loop has
    had every wakeup so far (it waits for the next one)."""
    async with asyncio.timeout(30):
        while producer._claims or producer._wake.is_set():
            if producer._claims:
                await asyncio.wait(set(producer._claims))
            else:
                await asyncio.sleep(0)  # the producer's pass, which clears the wakeup


async def test_a_wakeup_sends_its_claim_without_waiting_for_the_producers_turn(
    cyclone_env: CycloneEnv,
) -> None:
    client = cyclone_env.client

    async def quietly(n: int) -> cyclone.ResultRun[int]:
        """Enqueued in a transaction of our own, its wakeup never published: none comes."""
        async with cyclone_env.pool.acquire() as conn, conn.transaction():
            return await double.enqueue_tx(client, conn, n)

    async with fast_worker(client, steps=[double], poll_interval=3600) as worker:
        await asyncio.wait_for(client.services.notifier.connected.wait(), 30)
        producer = worker._producers[double.queue]
        await settled(producer)
        run = await quietly(4)
        producer.wake()
        # Idle, the producer starts the claim in wake() itself, not in its own later pass of
        # the event loop (a wakeup's claim goes out that much sooner), which it does not wake
        # (that pass would claim again once this claim is back).
        assert len(producer._claims) == 1
        assert not producer._wake.is_set(), "wake() claimed and woke the loop as well"
        assert await run.result(timeout=30) == 8
        # With a claim in flight, a wakeup is left to the producer's pass, which claims
        # again once that claim is back (the wakeup may be for work it began too early for).
        run = await quietly(5)
        producer.wake()
        producer.wake()
        assert len(producer._claims) == 1
        assert await run.result(timeout=30) == 10
        # A stopping producer starts no claim, woken or not.
        before = set(producer._claims)
        producer.stop()
        producer.wake()
        assert producer._claims <= before


async def test_a_wakeup_for_work_committed_during_a_claim_claims_again(
    cyclone_env: CycloneEnv, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A commit racing a claim: the claim's snapshot is taken before the job commits, and
    the job's wakeup arrives while that claim is still in flight. The claim comes back
    empty, and the producer claims again at once, not at the next poll (an hour away)."""
    plain = db.task_claim_plain
    gate = asyncio.Event()  # holds the next claim in flight, its rows already read
    held = asyncio.Event()

    async def gated(*args: Any) -> db.ClaimedRows:
        rows = await plain(*args)
        if not gate.is_set():
            held.set()
            await gate.wait()
        return rows

    client = cyclone_env.client
    async with fast_worker(client, steps=[double], poll_interval=3600) as worker:
        await asyncio.wait_for(client.services.notifier.connected.wait(), 30)
        producer = worker._producers[double.queue]
        await settled(producer)
        monkeypatch.setattr(db, "task_claim_plain", gated)
        producer.wake()  # a claim of an empty queue, held once it has read it
        await asyncio.wait_for(held.wait(), 30)
        # Committed after that read. Its wakeup reaches the worker as the block ends (this
        # process's listeners get it as its NOTIFY goes out), with the claim in flight.
        async with cyclone_env.pool.acquire() as conn, client.transaction(conn) as tx:
            run = await double.enqueue_tx(client, tx, 6)
        assert producer._claims
        async with asyncio.timeout(30):  # the producer's pass has taken that wakeup
            while producer._wake.is_set():  # noqa: ASYNC110 - the producer's own pass
                await asyncio.sleep(0)
        gate.set()  # the claim comes back with nothing
        assert await run.result(timeout=30) == 12


async def test_a_claim_whose_connection_was_cut_is_sent_again_soon(
    cyclone_env: CycloneEnv, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A claim fails as its connection is cut under it (a fault the test raises where the
    claim's reply would come): the producer claims again within moments, backing off, not
    at the next poll (an hour away)."""
    plain = db.task_claim_plain
    failed = asyncio.Event()

    async def cut_once(*args: Any) -> db.ClaimedRows:
        if not failed.is_set():
            failed.set()
            raise asyncpg.ConnectionDoesNotExistError("connection was closed in the middle")
        return await plain(*args)

    client = cyclone_env.client
    async with fast_worker(client, steps=[double], poll_interval=3600) as worker:
        await asyncio.wait_for(client.services.notifier.connected.wait(), 30)
        await settled(worker._producers[double.queue])
        monkeypatch.setattr(db, "task_claim_plain", cut_once)
        run = await double.enqueue(client, 7)  # its wakeup's claim fails
        await asyncio.wait_for(failed.wait(), 30)
        assert await run.result(timeout=30) == 14


async def test_wakeups_faster_than_the_poll_make_one_claim_each(
    cyclone_env: CycloneEnv, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A claim that wake() starts counts as the producer's pass: the poll is due a whole
    interval after it, so wakeups that come more often than the poll make no polls between
    them (each poll would be one more claim)."""
    claims = 0
    plain = db.task_claim_plain

    async def counted(*args: Any) -> db.ClaimedRows:
        nonlocal claims
        claims += 1
        return await plain(*args)

    monkeypatch.setattr(db, "task_claim_plain", counted)
    client = cyclone_env.client
    async with fast_worker(client, steps=[double], poll_interval=0.6) as worker:
        await asyncio.wait_for(client.services.notifier.connected.wait(), 30)
        producer = worker._producers[double.queue]
        await settled(producer)
        before = claims
        for i in range(20):
            assert await (await double.enqueue(client, i)).result(timeout=30) == 2 * i
            # The workload's pace: a wakeup every 0.15 s or so, the poll every 0.48 to 0.6.
            await asyncio.sleep(0.15)
        made = claims - before
    # One claim per wakeup; a poll only after a gap longer than the poll's (a slow machine).
    assert 20 <= made <= 22


request_id: contextvars.ContextVar[str] = contextvars.ContextVar("request_id")
contexts_seen: list[str | None] = []


@cyclone.step("context_probe")
async def context_probe(ctx: cyclone.Context, n: int) -> int:
    contexts_seen.append(request_id.get(None))
    return n


async def test_handlers_do_not_run_in_the_enqueuers_context(cyclone_env: CycloneEnv) -> None:
    """The in-process wakeup runs in the enqueuing task (as the transaction commits): the
    claim it starts, and the handlers, still run in the worker's own context."""
    client = cyclone_env.client
    contexts_seen.clear()
    async with fast_worker(client, steps=[context_probe], poll_interval=3600):
        await asyncio.wait_for(client.services.notifier.connected.wait(), 30)
        token = request_id.set("request 1")  # after the worker started: the request's own
        try:
            async with cyclone_env.pool.acquire() as conn, client.transaction(conn) as tx:
                run = await context_probe.enqueue_tx(client, tx, 1)
            assert await run.result(timeout=30) == 1
            run = await context_probe.enqueue(client, 2)
            assert await run.result(timeout=30) == 2
        finally:
            request_id.reset(token)
    assert contexts_seen == [None, None]


async def test_polling_alone_finds_work(cyclone_env: CycloneEnv) -> None:
    quiet = cyclone.Client(cyclone_env.pool, notify=False)
    run = await double.enqueue(quiet, 4)
    async with fast_worker(quiet, steps=[double], poll_interval=0.2):
        assert await run.result(timeout=30) == 8
    assert quiet.services.notifier is None  # it never listens


graceful_probe = Probe()


@cyclone.step("graceful", queue="slow")
async def graceful(ctx: cyclone.Context, seconds: float) -> float:
    graceful_probe.started.set()
    await asyncio.sleep(seconds)
    graceful_probe.calls.append(ctx.attempt)
    return seconds


async def test_graceful_shutdown_lets_handlers_finish(cyclone_env: CycloneEnv) -> None:
    graceful_probe.reset()
    run = await graceful.enqueue(cyclone_env.client, 0.5)
    worker = fast_worker(cyclone_env.client, steps=[graceful], shutdown_timeout=30)
    async with worker:
        await asyncio.wait_for(graceful_probe.started.wait(), 30)
    assert graceful_probe.calls == [1]
    assert await run.status() is cyclone.RunState.COMPLETED


async def test_shutdown_deadline_cancels_and_gives_the_task_back(cyclone_env: CycloneEnv) -> None:
    graceful_probe.reset()
    run = await graceful.enqueue(cyclone_env.client, 3600)
    worker = fast_worker(cyclone_env.client, steps=[graceful], shutdown_timeout=0.1)
    async with worker:
        await asyncio.wait_for(graceful_probe.started.wait(), 30)
    assert graceful_probe.calls == []
    info = await run.info()
    # Back to available at once, the interrupted attempt given back.
    assert (info.state, info.nodes[0].state, info.nodes[0].attempts) == (
        cyclone.RunState.PENDING,
        "available",
        0,
    )


async def test_run_wait_times_out(cyclone_env: CycloneEnv) -> None:
    run = await double.enqueue(cyclone_env.client, 1)
    with pytest.raises(TimeoutError):
        await run.wait(timeout=0.2)


async def test_worker_arguments_are_checked(cyclone_env: CycloneEnv) -> None:
    with pytest.raises(cyclone.InvalidInputError):
        cyclone.Worker(cyclone_env.client)
    with pytest.raises(cyclone.InvalidInputError):
        cyclone.Worker(cyclone_env.client, steps=[double], queues={"default": 0})
    twin = cyclone.Step("double", double.handler)
    with pytest.raises(cyclone.InvalidInputError, match="two different steps"):
        cyclone.Worker(cyclone_env.client, steps=[double, twin])
    with pytest.raises(cyclone.InvalidInputError, match="claim_batch must be an int from 1 to"):
        cyclone.Worker(cyclone_env.client, steps=[double], claim_batch=1001)
    for lease in (0, float("inf")):
        with pytest.raises(cyclone.InvalidInputError, match="lease must be a number of seconds"):
            cyclone.Worker(cyclone_env.client, steps=[double], lease=lease)
    with pytest.raises(cyclone.InvalidInputError, match="claim_ahead must be True or False"):
        cyclone.Worker(cyclone_env.client, steps=[double], claim_ahead="no")  # type: ignore[arg-type]


async def test_run_until_cancelled(cyclone_env: CycloneEnv) -> None:
    worker = fast_worker(cyclone_env.client, steps=[double])
    task = asyncio.get_running_loop().create_task(worker.run())
    run = await double.enqueue(cyclone_env.client, 5)
    assert await run.result(timeout=30) == 10
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_scheduled_job_runs_when_due(cyclone_env: CycloneEnv) -> None:
    at = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=0.5)
    run = await double.enqueue(cyclone_env.client, 1, process_at=at)
    async with fast_worker(cyclone_env.client, steps=[double]):
        assert await run.result(timeout=30) == 2
    finished = (await run.info()).finished_at
    assert finished is not None and finished >= at


ran: list[int] = []


@cyclone.step("once.each", queue="shared")
async def once_each(ctx: cyclone.Context, n: int) -> int:
    ran.append(n)
    await asyncio.sleep(0)
    return n


async def test_three_workers_run_each_job_once(cyclone_env: CycloneEnv) -> None:
    ran.clear()
    runs = await once_each.enqueue_many(cyclone_env.client, list(range(600)))
    pools = [await asyncpg.create_pool(cyclone_env.dsn, min_size=1, max_size=5) for _ in range(3)]
    try:
        workers = [
            fast_worker(cyclone.Client(p), steps=[once_each], queues={"shared": 20}, claim_batch=7)
            for p in pools
        ]
        async with workers[0], workers[1], workers[2]:
            for run in runs:
                assert await run.wait(timeout=120) is cyclone.RunState.COMPLETED
    finally:
        for pool in pools:
            await pool.close()
    assert sorted(ran) == list(range(600))  # every job ran exactly once
