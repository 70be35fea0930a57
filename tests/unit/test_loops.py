"""The background loops: their wait (woken at once by the event, else back after the
timeout) and their supervision (a failed pass never ends the loop)."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from cyclone._services.loops import RETRY_FIRST, every, jittered, retry_delay, wait_woken


async def test_a_set_event_ends_the_wait_at_once() -> None:
    wake = asyncio.Event()
    asyncio.get_running_loop().call_soon(wake.set)
    assert await wait_woken(wake, 60) is True


async def test_the_wait_ends_unwoken_after_the_timeout() -> None:
    assert await wait_woken(asyncio.Event(), 0.01) is False


def test_the_jittered_poll_is_at_most_a_fifth_shorter() -> None:
    assert all(8.0 <= jittered(10.0) <= 10.0 for _ in range(100))


def test_retries_after_a_cut_start_soon_and_back_off_to_the_cap() -> None:
    assert [retry_delay(n, 1.0, jitter=False) for n in (1, 2, 3, 5, 10)] == [
        RETRY_FIRST,
        2 * RETRY_FIRST,
        4 * RETRY_FIRST,
        0.8,
        1.0,
    ]
    # Jittered into the upper half, so that processes cut off together come back apart.
    delays = {retry_delay(3, 1.0) for _ in range(100)}
    assert all(0.1 <= d <= 0.2 for d in delays) and len(delays) > 1


async def test_a_loop_may_pass_first_at_once_and_choose_its_next_wait() -> None:
    passes: list[float] = []
    third = asyncio.Event()

    async def work() -> float:
        passes.append(asyncio.get_running_loop().time())
        if len(passes) == 3:
            third.set()
        return 0.001  # the next pass far sooner than the interval

    loop = asyncio.create_task(every(3600, work, first=0.0, what="test", worker_id="w"))
    try:
        await asyncio.wait_for(third.wait(), 30)
    finally:
        loop.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await loop


async def test_a_pass_that_raises_anything_is_logged_and_the_loop_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    passes: list[int] = []
    third = asyncio.Event()

    async def work() -> None:
        passes.append(len(passes))
        if len(passes) == 1:
            raise KeyError("a bug in one pass")
        if len(passes) == 3:
            third.set()

    loop = asyncio.create_task(every(0.001, work, what="heartbeat", worker_id="w1"))
    try:
        await asyncio.wait_for(third.wait(), 30)
    finally:
        loop.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await loop
    [record] = [r for r in caplog.records if "heartbeat failed" in r.getMessage()]
    assert record.levelname == "ERROR" and "KeyError" in record.getMessage()
    assert record.exc_info is not None and record.worker == "w1"
