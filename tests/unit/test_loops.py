"""The background loops: their wait (woken at once by the event, else back after the
timeout) and their supervision (a failed pass never ends the loop)."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from cyclone._services.loops import every, jittered, wait_woken


async def test_a_set_event_ends_the_wait_at_once() -> None:
    wake = asyncio.Event()
    asyncio.get_running_loop().call_soon(wake.set)
    assert await wait_woken(wake, 60) is True


async def test_the_wait_ends_unwoken_after_the_timeout() -> None:
    assert await wait_woken(asyncio.Event(), 0.01) is False


def test_the_jittered_poll_is_at_most_a_fifth_shorter() -> None:
    assert all(8.0 <= jittered(10.0) <= 10.0 for _ in range(100))


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
