"""Progress and streams: items in one total order per run (also from two attempts of one
node writing at once), a reader that resumes from an offset and ends with the run after
every item written before its end, appends refused once the run ended, throttled progress
(counted in writes) whose last report lands before the run completes, sync handlers, bad
input refused before a write, and purge taking a run's items and progress with it."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import uuid
from collections.abc import AsyncIterator
from typing import Any

import anyio.from_thread
import asyncpg
import pytest

import cyclone
from cyclone.testing.plugin import CycloneEnv

WAIT = 60.0
gates: dict[str, asyncio.Event] = {}


@cyclone.step("streams.count", queue="streams")
async def count(ctx: cyclone.Context, n: int) -> int:
    for i in range(n):
        await ctx.stream({"i": i, "node": ctx.node})
    return n


@cyclone.step("streams.gated", queue="streams")
async def gated(ctx: cyclone.Context, n: int) -> int:
    for i in range(n):
        await ctx.stream(i)
        if i == 2:
            await gates["gated"].wait()  # the reader sees the first items while this runs
    return n


@cyclone.step("streams.progress", queue="streams")
async def reporting(ctx: cyclone.Context, n: int) -> int:
    for i in range(1, n + 1):
        await ctx.report({"done": i, "total": n})
    return n


@cyclone.step("streams.flaky", queue="streams", max_attempts=2)
async def flaky(ctx: cyclone.Context, n: int) -> int:
    await ctx.stream({"attempt": ctx.attempt})
    await ctx.report(ctx.attempt / 2)
    if ctx.attempt == 1:
        raise ValueError("first attempt fails")
    return n


@cyclone.step("streams.sync", queue="streams")
def in_thread(ctx: cyclone.Context, n: int) -> int:
    for i in range(n):
        anyio.from_thread.run(ctx.stream, i)
    anyio.from_thread.run(ctx.report, 1.0)
    return n


@cyclone.step("streams.bad", queue="streams", max_attempts=1)
async def bad(ctx: cyclone.Context, n: int) -> int:
    try:
        await ctx.stream(object())
    except cyclone.InvalidInputError as exc:
        await ctx.report(str(exc))
    return n


fan = cyclone.define("streams.fan", int)
fan.node(count, name="left")
fan.node(count, name="right")


async def finish(env: CycloneEnv, run: cyclone.Run, step: Any) -> None:
    """Run ``step`` until ``run`` ends (waited for: a drain does not wait out a backoff)."""
    async with env.worker(steps=[step]):
        assert await run.wait(timeout=WAIT) is cyclone.RunState.COMPLETED


async def read_all(run: cyclone.Run, after: int = 0, **kw: Any) -> list[cyclone.StreamItem]:
    async with asyncio.timeout(WAIT):
        return [item async for item in run.stream(after, **kw)]


async def test_items_are_in_one_order_and_a_reader_resumes_from_an_offset(
    cyclone_env: CycloneEnv,
) -> None:
    run = await fan.submit(cyclone_env.client, 20)
    # Started before any worker: it waits, woken as the items come, and ends with the run.
    reader = asyncio.create_task(read_all(run))
    async with cyclone_env.worker(workflows=[fan]):
        items = await reader
    assert await run.status() is cyclone.RunState.COMPLETED
    assert [i.offset for i in items] == list(range(1, 41))
    for node in ("left", "right"):  # each node's items in the order it wrote them
        assert [i.value["i"] for i in items if i.node == node] == list(range(20))
        assert all(i.value["node"] == node for i in items if i.node == node)
    assert {i.attempt for i in items} == {1}
    # Resumed from an offset: exactly the items after it, and again it ends.
    assert await read_all(run, 17) == items[17:]
    assert await read_all(run, 40) == []
    assert await read_all(run, node="right") == [i for i in items if i.node == "right"]


async def test_a_reader_sees_items_while_the_handler_runs(cyclone_env: CycloneEnv) -> None:
    gates["gated"] = asyncio.Event()
    run = await gated.enqueue(cyclone_env.client, 5)
    seen: list[int] = []
    async with cyclone_env.worker(steps=[gated]):
        async with asyncio.timeout(WAIT):
            async for item in run.stream():
                seen.append(item.value)
                assert item.node == "streams.gated"  # a job's node is its kind
                if item.value == 2:
                    assert await run.status() is cyclone.RunState.RUNNING
                    gates["gated"].set()
    assert seen == [0, 1, 2, 3, 4]


async def test_two_attempts_appending_at_once_get_one_gapless_order(
    cyclone_env: CycloneEnv,
) -> None:
    """A retry after a lost lease writes while the old attempt still does: the stream's run
    row lock hands out offsets in commit order, each attempt's in its own order."""
    run = await count.enqueue(cyclone_env.client, 1)  # pending: its stream is open
    streams = cyclone_env.client.services.streams

    async def attempt(n: int) -> list[int]:
        return [await streams.append(run.id, "w", n, f'{{"n": {n}, "i": {i}}}') for i in range(50)]

    first, second = await asyncio.gather(attempt(1), attempt(2))
    assert sorted(first + second) == list(range(1, 101))
    assert first == sorted(first) and second == sorted(second)
    items = [i async for i in _until(run, 100)]
    assert [i.value["i"] for i in items if i.attempt == 1] == list(range(50))
    assert all(i.value["n"] == i.attempt for i in items)


async def _until(run: cyclone.Run, last: int) -> AsyncIterator[cyclone.StreamItem]:
    async with contextlib.aclosing(run.stream()) as items:
        async for item in items:
            yield item
            if item.offset == last:
                return


async def test_the_stream_of_an_ended_run_is_closed(cyclone_env: CycloneEnv) -> None:
    run = await count.enqueue(cyclone_env.client, 2)
    await cyclone_env.drain(steps=[count])
    with pytest.raises(cyclone.InvalidStateError, match="has ended"):
        await cyclone_env.client.services.streams.append(run.id, "late", 1, "3")
    assert [i.value["i"] for i in await read_all(run)] == [0, 1]
    with pytest.raises(cyclone.InvalidInputError, match="after"):
        run.stream(-1)
    with pytest.raises(cyclone.RunNotFoundError):
        await read_all(cyclone.Run(cyclone_env.client, uuid.uuid4()))


async def test_progress_is_throttled_and_the_last_report_lands(cyclone_env: CycloneEnv) -> None:
    run = await reporting.enqueue(cyclone_env.client, 500)
    await cyclone_env.drain(steps=[reporting])
    assert await run.status() is cyclone.RunState.COMPLETED
    # The last report is read as soon as the run completed: it was written before.
    assert await run.progress() == {"streams.progress": {"done": 500, "total": 500}}
    writes = await cyclone_env.pool.fetchval("SELECT writes FROM cyclone_progress")
    # 500 reports in a tight loop: the first is written, the rest wait for the interval
    # and replace each other; the loop takes far less than the 125 s of unthrottled writes.
    assert 2 <= writes <= 50


async def test_a_retry_streams_on_after_its_failed_attempt(cyclone_env: CycloneEnv) -> None:
    run = await flaky.enqueue(cyclone_env.client, 1)
    await finish(cyclone_env, run, flaky)
    assert await run.status() is cyclone.RunState.COMPLETED
    items = await read_all(run)
    assert [(i.offset, i.attempt, i.value) for i in items] == [
        (1, 1, {"attempt": 1}),
        (2, 2, {"attempt": 2}),
    ]
    assert await run.progress() == {"streams.flaky": 1.0}
    # A report of an earlier attempt (one that lost its lease, writing late) does not
    # overwrite a later attempt's.
    await cyclone_env.client.services.streams.report(run.id, "streams.flaky", 1, "0.25")
    assert await run.progress() == {"streams.flaky": 1.0}


async def test_sync_handlers_stream_and_report_through_the_loop(cyclone_env: CycloneEnv) -> None:
    run = await in_thread.enqueue(cyclone_env.client, 3)
    await cyclone_env.drain(steps=[in_thread])
    assert [i.value for i in await read_all(run)] == [0, 1, 2]
    assert await run.progress() == {"streams.sync": 1.0}


async def test_an_item_that_is_not_json_is_refused_before_a_write(
    cyclone_env: CycloneEnv,
) -> None:
    run = await bad.enqueue(cyclone_env.client, 1)
    await cyclone_env.drain(steps=[bad])
    assert await read_all(run) == []
    [message] = (await run.progress()).values()
    assert "a stream item cannot be encoded as JSON" in message


async def test_a_reader_without_notifications_polls(cyclone_env: CycloneEnv) -> None:
    async with cyclone.Client(cyclone_env.pool, notify=False) as quiet:
        run = await count.enqueue(quiet, 3)
        reader = asyncio.create_task(read_all(await quiet.get_run(run.id)))
        await cyclone_env.drain(steps=[count])
        assert [i.value["i"] for i in await reader] == [0, 1, 2]


async def test_purge_deletes_a_runs_items_and_progress(cyclone_env: CycloneEnv) -> None:
    run = await flaky.enqueue(cyclone_env.client, 1)
    await finish(cyclone_env, run, flaky)
    pool: asyncpg.Pool = cyclone_env.pool
    assert await pool.fetchval("SELECT count(*) FROM cyclone_streams") == 2
    assert await cyclone_env.client.purge_terminal_runs(dt.timedelta(0)) == 1
    assert await pool.fetchval("SELECT count(*) FROM cyclone_streams") == 0
    assert await pool.fetchval("SELECT count(*) FROM cyclone_progress") == 0
    with pytest.raises(cyclone.RunNotFoundError):
        await run.progress()
