"""The background loops' wait: woken at once by the event, else back after the timeout."""

from __future__ import annotations

import asyncio

from cyclone._loops import jittered, wait_woken


async def test_a_set_event_ends_the_wait_at_once() -> None:
    wake = asyncio.Event()
    asyncio.get_running_loop().call_soon(wake.set)
    assert await wait_woken(wake, 60) is True


async def test_the_wait_ends_unwoken_after_the_timeout() -> None:
    assert await wait_woken(asyncio.Event(), 0.01) is False


def test_the_jittered_poll_is_at_most_a_fifth_shorter() -> None:
    assert all(8.0 <= jittered(10.0) <= 10.0 for _ in range(100))
