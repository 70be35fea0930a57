"""Flow control configured in code: bad values refused before anything is written, changes
while work runs, resume waking workers, kind limits, and what stats() shows."""

from __future__ import annotations

import asyncio
import datetime as dt

import pytest

import cyclone
from cyclone.testing.plugin import CycloneEnv
from tests.conftest import fast_worker

running: set[int] = set()
peak = [0]
release = asyncio.Event()
five = asyncio.Event()  # five hold handlers run at once


@cyclone.step("flow.hold", queue="held")
async def hold(ctx: cyclone.Context, n: int) -> int:
    running.add(n)
    peak[0] = max(peak[0], len(running))
    if len(running) >= 5:
        five.set()
    try:
        await release.wait()
    finally:
        running.discard(n)
    return n


@cyclone.step("flow.quick", queue="held")
async def quick(ctx: cyclone.Context, n: int) -> int:
    return n


@pytest.fixture(autouse=True)
def fresh() -> None:
    global release, five
    running.clear()
    peak[0] = 0
    release, five = asyncio.Event(), asyncio.Event()


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"concurrency": 0}, "concurrency must be at least 1"),
        ({"concurrency": -3}, "concurrency must be at least 1"),
        ({"key_concurrency": 0}, "key_concurrency must be at least 1"),
        ({"concurrency": True}, "concurrency must be an int"),
        ({"concurrency": 2.5}, "concurrency must be an int"),
        ({"rate": 10}, "rate=10 needs its period"),
        ({"per": 1.0}, "per= was given without rate="),
        ({"rate": 10, "per": 0}, "per must be a positive, finite number"),
        ({"rate": 10, "per": -1.0}, "per must be a positive, finite number"),
        ({"rate": 0, "per": 1.0}, "rate must be at least 1"),
        ({"key_rate": 0, "key_per": 1.0}, "key_rate must be at least 1"),
        ({"key_rate": -1, "key_per": 1.0}, "key_rate must be at least 1"),
        ({"key_rate": 1.5, "key_per": 1.0}, "key_rate must be an int"),
        ({"key_rate": 10}, "key_rate=10 needs its period: key_per=1.0"),
        ({"key_per": 1.0}, "key_per= was given without key_rate="),
        ({"key_rate": 10, "key_per": 0}, "key_per must be a positive, finite number"),
        ({"key_rate": 10, "key_per": float("nan")}, "key_per must be a positive, finite"),
        ({"key_rate": 10, "key_per": "1s"}, "key_per must be a timedelta or seconds"),
    ],
)
async def test_bad_limits_are_refused_and_write_nothing(
    cyclone_env: CycloneEnv, options: dict[str, object], message: str
) -> None:
    queues = cyclone_env.client.queues
    with pytest.raises(cyclone.InvalidLimitError, match=message):
        await queues.set_limits("held", create=True, **options)  # type: ignore[arg-type]
    kind_options = {k: v for k, v in options.items() if not k.startswith("key_")}
    if kind_options:  # a kind's limits are checked alike
        with pytest.raises(cyclone.InvalidLimitError, match=message):
            await queues.set_kind_limits("flow.hold", **kind_options)  # type: ignore[arg-type]
    assert await cyclone_env.pool.fetchval("SELECT count(*) FROM cyclone_queues") == 0
    assert await cyclone_env.pool.fetchval("SELECT count(*) FROM cyclone_kind_limits") == 0


async def test_an_unknown_queue_or_a_bad_name_is_refused(cyclone_env: CycloneEnv) -> None:
    queues = cyclone_env.client.queues
    with pytest.raises(cyclone.UnknownQueueError, match="queue 'helld' is unknown"):
        await queues.pause("helld")
    with pytest.raises(cyclone.UnknownQueueError):
        await queues.set_limits("helld", concurrency=2)
    with pytest.raises(cyclone.InvalidNameError):
        await queues.pause("no spaces", create=True)
    with pytest.raises(cyclone.InvalidLimitError, match="expected a QueueLimits"):
        await queues.apply({"held": 3})  # type: ignore[dict-item]
    with pytest.raises(cyclone.InvalidKeyError):
        await hold.enqueue(cyclone_env.client, 1, group="")
    assert await cyclone_env.pool.fetchval("SELECT count(*) FROM cyclone_queues") == 0
    assert await cyclone_env.pool.fetchval("SELECT count(*) FROM cyclone_runs") == 0
    # Known once a live worker claims from it.
    async with fast_worker(cyclone_env.client, steps=[hold], queues={"held": 1}):
        assert await queues.pause("held") is True
    assert (await queues.get("held")).paused


async def test_lowering_a_limit_interrupts_nothing_and_the_next_claim_obeys(
    cyclone_env: CycloneEnv,
) -> None:
    client = cyclone_env.client
    await client.queues.set_limits("held", concurrency=5, create=True)
    runs = await hold.enqueue_many(client, list(range(12)))
    async with fast_worker(client, steps=[hold], queues={"held": 10}):
        await asyncio.wait_for(five.wait(), 60)
        await client.queues.set_limits("held", concurrency=2)
        assert len(running) == 5  # nothing running was stopped
        release.set()  # the 5 finish; from now on at most 2 run at once
        peak[0] = 0
        states = [await r.wait(timeout=60) for r in runs]
    assert states == [cyclone.RunState.COMPLETED] * 12
    assert 1 <= peak[0] <= 2
    settings = await client.queues.get("held")
    assert settings.limits == cyclone.QueueLimits(concurrency=2)


async def test_a_kind_limit_holds_on_its_queue_beside_unlimited_kinds(
    cyclone_env: CycloneEnv,
) -> None:
    client = cyclone_env.client
    await client.queues.apply({}, kinds={"flow.hold": cyclone.KindLimits(concurrency=1)})
    held = await hold.enqueue_many(client, list(range(4)))
    quick_runs = await quick.enqueue_many(client, list(range(20)))
    async with fast_worker(client, steps=[hold, quick], queues={"held": 10}):
        for r in quick_runs:  # the unlimited kind is not held up by the limited one
            assert await r.wait(timeout=60) is cyclone.RunState.COMPLETED
        assert peak[0] == 1
        release.set()
        for r in held:
            assert await r.wait(timeout=60) is cyclone.RunState.COMPLETED
    assert peak[0] == 1
    assert await client.queues.kind_limits() == {"flow.hold": cyclone.KindLimits(concurrency=1)}


async def test_resume_wakes_workers_at_once(cyclone_env: CycloneEnv) -> None:
    client = cyclone_env.client
    await client.queues.pause("held", create=True)
    run = await quick.enqueue(client, 1)
    # A poll of a minute: only the resume's wakeup can start the job within the timeout.
    async with fast_worker(client, steps=[quick], queues={"held": 2}, poll_interval=60.0):
        await asyncio.sleep(0.3)  # the worker claimed (woken by the enqueue) and got nothing
        assert await run.status() == cyclone.RunState.PENDING
        assert await client.queues.resume("held") is True
        assert await run.wait(timeout=20) is cyclone.RunState.COMPLETED


async def test_stats_show_paused_and_limited_queues(cyclone_env: CycloneEnv) -> None:
    client = cyclone_env.client
    await client.queues.set_limits(
        "idle",
        concurrency=3,
        rate=10,
        per=60,
        key_concurrency=1,
        key_rate=5,
        create=True,
        key_per=dt.timedelta(minutes=1),
    )
    await client.queues.pause("idle")
    stats = {s.queue: s for s in await client.stats()}
    idle = stats["idle"]
    assert idle.paused and idle.concurrency_limit == 3 and idle.key_concurrency_limit == 1
    assert idle.rate_limit == (10, 60.0) and idle.key_rate_limit == (5, 60.0)
    assert (await client.queues.get("idle")).limits == cyclone.QueueLimits(3, 10, 60, 1, 5, 60)
    assert [s.queue for s in await client.queues.list()] == ["idle"]
    await client.queues.set_limits("idle")  # clears them all; still paused
    assert (await client.queues.get("idle")).limits == cyclone.QueueLimits()
    await client.queues.resume("idle")
    assert await client.queues.list() == []
