"""Sleep nodes: they complete at their wake time (never before), from sleep=, until= a time
or until= a function of the input and outputs; a past wake time completes at once; a
sleeping node holds no slot, shows as sleeping with its wake time (info, explain, the CLI)
and stops when its run is cancelled; a deadline or a failure elsewhere leaves it asleep,
and a retry goes on from it. (Across a SIGKILLed worker: tests/e2e/test_sleep_kill.py.)"""

from __future__ import annotations

import asyncio
import datetime as dt
from typing import Any

import pytest

import cyclone
from cyclone._services.effects import SCHEDULES_WAKEUP
from cyclone._worker import maintenance
from cyclone.testing.plugin import CycloneEnv
from tests.cli.process import cli
from tests.conftest import Probe, QueueWakeups, fast_worker, queue_wakeups

probe = Probe()
FAIL = {"side": True}


@cyclone.step("sleepy.first")
async def first(ctx: cyclone.Context, n: int) -> dt.datetime:
    probe.calls.append(ctx.kind)
    return dt.datetime.now(dt.UTC)


@cyclone.step("sleepy.last")
async def last(ctx: cyclone.Context, n: int) -> int:
    probe.calls.append(ctx.kind)
    return n + 1


@cyclone.step("sleepy.side", max_attempts=1)
async def side(ctx: cyclone.Context, n: int) -> int:
    await probe.started.wait()  # the test's go
    if FAIL["side"]:
        raise RuntimeError("side failed")
    return n


def flow(name: str, **sleep: Any) -> cyclone.ResultWorkflow[int, int]:
    """first -> nap (a sleep node) -> last."""
    wf = cyclone.define_result(name, int, int)
    napped = wf.sleep("nap", after=[wf.node(first)], **sleep)
    wf.set_result(wf.node(last, after=[napped]))
    return wf


half_second = flow("sleepy.seconds", sleep=0.5)
computed = flow(
    "sleepy.computed",
    until=lambda n, outputs: outputs["sleepy.first"] + dt.timedelta(seconds=n / 10),
)
PAST = dt.datetime(2020, 1, 2, 3, 4, 5, 678901, tzinfo=dt.UTC)
long_ago = flow("sleepy.past", until=PAST)
long_nap = flow("sleepy.long", sleep=dt.timedelta(hours=1))
naive = flow("sleepy.naive", until=lambda n, outputs: dt.datetime(2030, 1, 1))

# first -> nap (0.5 s) -> last, and side (fails while nap sleeps) beside them
beside = cyclone.define_result("sleepy.beside", int, int)
_first = beside.node(first)
beside.node(side, after=[_first])
beside.set_result(beside.node(last, after=[beside.sleep("nap", after=[_first], sleep=0.5)]))


@pytest.fixture(autouse=True)
def _reset() -> None:
    probe.reset()
    FAIL["side"] = True


async def asleep(seen: QueueWakeups) -> None:
    """Until a node went to sleep: the completion that puts one to sleep wakes every
    worker's timer, after its commit."""
    async with asyncio.timeout(30):
        while SCHEDULES_WAKEUP not in seen.queues:
            seen.grew.clear()
            await seen.grew.wait()


async def outputs(run: cyclone.Run) -> dict[str, Any]:
    return {name: p.output for name, p in (await run.payloads()).nodes.items()}


async def test_a_sleep_node_completes_at_its_wake_time_and_not_before(
    cyclone_env: CycloneEnv,
) -> None:
    run = await half_second.submit(cyclone_env.client, 1)
    async with fast_worker(cyclone_env.client, workflows=[half_second]):
        assert await run.result(timeout=60) == 2
    info = await run.info()
    nodes = {n.name: n for n in info.nodes}
    assert nodes["nap"].state == "completed" and nodes["nap"].wake_at is None
    assert nodes["nap"].kind == "cyclone.sleep:default" and nodes["nap"].attempts == 1
    woke = dt.datetime.fromisoformat((await outputs(run))["nap"])
    started = dt.datetime.fromisoformat((await outputs(run))["sleepy.first"])
    # The wake time is 0.5 s after the node started (the database's clock, as the run's
    # timestamps), and what comes after the node ran after it: lower bounds only.
    assert woke >= started + dt.timedelta(seconds=0.5)
    assert info.finished_at is not None and info.finished_at >= woke
    assert probe.calls == ["sleepy.first", "sleepy.last"]


async def test_an_until_function_gets_the_input_and_the_outputs_before_it(
    cyclone_env: CycloneEnv,
) -> None:
    run = await computed.submit(cyclone_env.client, 4)
    async with fast_worker(cyclone_env.client, workflows=[computed]):
        assert await run.result(timeout=60) == 5
    found = await outputs(run)
    first_done = dt.datetime.fromisoformat(found["sleepy.first"])
    assert dt.datetime.fromisoformat(found["nap"]) == first_done + dt.timedelta(seconds=0.4)
    finished = (await run.info()).finished_at
    assert finished is not None and finished >= first_done + dt.timedelta(seconds=0.4)


async def test_a_wake_time_in_the_past_completes_the_node_at_once(
    cyclone_env: CycloneEnv,
) -> None:
    root = cyclone.define_result("sleepy.past_root", int, int)
    root.set_result(root.node(last, after=[root.sleep("nap", until=PAST)]))
    runs = [await long_ago.submit(cyclone_env.client, 1), await root.submit(cyclone_env.client, 2)]
    async with fast_worker(cyclone_env.client, workflows=[long_ago, root]):
        assert [await r.result(timeout=60) for r in runs] == [2, 3]
    for run in runs:
        assert dt.datetime.fromisoformat((await outputs(run))["nap"]) == PAST


async def test_a_sleeping_node_holds_no_slot_shows_its_wake_time_and_stops_on_cancel(
    cyclone_env: CycloneEnv,
) -> None:
    client = cyclone_env.client
    async with queue_wakeups(client) as seen:
        run = await long_nap.submit(client, 1)
        worker = fast_worker(client, workflows=[long_nap], steps=[last], queues={"default": 1})
        async with worker:
            await asleep(seen)
            before = dt.datetime.now(dt.UTC)
            info = await run.info()
            nap = {n.name: n for n in info.nodes}["nap"]
            assert nap.state == "sleeping" and nap.wake_at is not None
            hour = dt.timedelta(hours=1)
            assert before + hour - dt.timedelta(minutes=1) < nap.wake_at <= before + hour
            reasons = {r.node: r for r in (await client.explain(run.id)).reasons}
            reason = reasons["nap"]
            assert reason.code is cyclone.ReasonCode.SLEEPING
            assert reason.until == nap.wake_at and "Sleeping until" in reason.message
            code, out, err = await cli("runs", "show", str(run.id), dsn=cyclone_env.dsn)
            assert code == 0, err
            line = f"nap\tcyclone.sleep:default\tsleeping until {nap.wake_at:%F %T} UTC\t1\t"
            assert line in out
            # The queue has one slot, and a job on it runs while the node sleeps.
            job = await last.enqueue(client, 41)
            assert await job.result(timeout=60) == 42
            assert await run.cancel()
        info = await run.info()
    assert info.state is cyclone.RunState.CANCELLED
    nap = {n.name: n for n in info.nodes}["nap"]
    assert (nap.state, nap.wake_at) == ("cancelled", None)
    assert probe.calls == ["sleepy.first", "sleepy.last"]  # the job's, never the run's


async def test_a_deadline_before_the_wake_time_fails_the_run(cyclone_env: CycloneEnv) -> None:
    client = cyclone_env.client
    deadline = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=4)
    async with queue_wakeups(client) as seen:
        run = await long_nap.submit(client, 1, run_deadline=deadline)
        async with fast_worker(client, workflows=[long_nap]):
            await asleep(seen)
            assert await run.wait(timeout=60) is cyclone.RunState.FAILED
    info = await run.info()
    assert info.error is not None and info.error["type"] == "DeadlineExceeded"
    nap = {n.name: n for n in info.nodes}["nap"]
    assert nap.state == "sleeping"  # it sleeps on, and completes nothing after it
    assert probe.calls == ["sleepy.first"]


async def test_a_run_failed_elsewhere_goes_on_from_its_sleep_node_after_a_retry(
    cyclone_env: CycloneEnv,
) -> None:
    client = cyclone_env.client
    async with queue_wakeups(client) as seen:
        run = await beside.submit(client, 1)
        async with fast_worker(client, workflows=[beside]):
            await asleep(seen)
            wake_at = {n.name: n for n in (await run.info()).nodes}["nap"].wake_at
            probe.started.set()  # side fails now, while nap sleeps
            assert await run.wait(timeout=60) is cyclone.RunState.FAILED
            FAIL["side"] = False
            await run.retry_all()
            assert await run.result(timeout=60) == 2
    nap = {n.name: n for n in (await run.info()).nodes}["nap"]
    # The wake time was worked out once and kept: the retry did not sleep again.
    assert nap.attempts == 1 and wake_at is not None
    assert dt.datetime.fromisoformat((await outputs(run))["nap"]) == wake_at
    assert probe.calls.count("sleepy.last") == 1


async def test_an_until_function_giving_a_naive_datetime_fails_the_node(
    cyclone_env: CycloneEnv,
) -> None:
    run = await naive.submit(cyclone_env.client, 1)
    async with fast_worker(cyclone_env.client, workflows=[naive]):
        assert await run.wait(timeout=60) is cyclone.RunState.FAILED
    nap = {n.name: n for n in (await run.info()).nodes}["nap"]
    assert nap.state == "failed" and nap.attempts == 3
    assert nap.errors[-1]["type"] == "InvalidInputError"
    assert "timezone-aware" in nap.errors[-1]["message"]


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({}, "takes one of sleep="),
        ({"sleep": 1, "until": PAST}, "takes one of sleep="),
        ({"sleep": -1}, "non-negative"),
        ({"sleep": float("inf")}, "longer than 36500 days"),
        ({"until": dt.datetime(2030, 1, 1)}, "timezone-aware"),
        ({"until": "tomorrow"}, "must be an aware datetime or a function"),
    ],
)
def test_a_bad_sleep_node_is_refused_at_definition(options: dict[str, Any], message: str) -> None:
    wf = cyclone.define("sleepy.bad", int)
    with pytest.raises(cyclone.InvalidInputError, match=message):
        wf.sleep("nap", **options)
    assert not wf.nodes


async def test_a_sleep_node_works_with_sealed_payloads(cyclone_env: CycloneEnv) -> None:
    """With a keyring, the outputs the until= function reads are sealed, and the wake time
    (no secret) is stored plain: the completion reads it in SQL."""
    keyring = cyclone.Keyring({"k": bytes(range(32))}, current="k")
    async with cyclone.Client(cyclone_env.pool, cipher=keyring) as client:
        run = await computed.submit(client, 2)
        async with fast_worker(client, workflows=[computed]):
            assert await run.result(timeout=60) == 3
        found = await outputs(run)
    first_done = dt.datetime.fromisoformat(found["sleepy.first"])
    assert dt.datetime.fromisoformat(found["nap"]) == first_done + dt.timedelta(seconds=0.2)
    sealed = await cyclone_env.pool.fetchval(
        "SELECT output::text FROM cyclone_steps WHERE node = 'sleepy.first'"
    )
    assert "$cyclone.sealed" in sealed


async def test_timers_racing_to_wake_a_node_wake_it_once(cyclone_env: CycloneEnv) -> None:
    """Every worker's timer wakes due sleep nodes: two passes at once lock the run in turn,
    and the second finds the node awake already."""
    client = cyclone_env.client
    async with queue_wakeups(client) as seen:
        run = await long_nap.submit(client, 5)
        async with fast_worker(client, workflows=[long_nap]):
            await asleep(seen)
            await cyclone_env.pool.execute(  # its hour has passed
                "UPDATE cyclone_steps SET wait_until = now() - interval '1 second'"
                " WHERE node = 'nap'"
            )
            await asyncio.gather(
                *(maintenance.expire_overdue(client.services, worker_id=w) for w in "ab")
            )
            assert await run.result(timeout=60) == 6
    nap = {n.name: n for n in (await run.info()).nodes}["nap"]
    assert (nap.state, nap.attempts) == ("completed", 1)
    assert probe.calls == ["sleepy.first", "sleepy.last"]
