"""How the background loops (a queue's producer, the schedule timer) wait between passes:
until woken or a timeout, whichever comes first, with the poll jittered."""

from __future__ import annotations

import asyncio
import contextlib
import random


def jittered(interval: float) -> float:
    """``interval`` less up to a fifth at random, so that processes started together do not
    poll together."""
    return interval * random.uniform(0.8, 1.0)


async def wait_woken(wake: asyncio.Event, timeout: float) -> bool:
    """Wait until ``wake`` is set or ``timeout`` seconds have passed; whether it was set.

    The caller clears ``wake`` before its pass, so a wakeup during the pass is not lost.
    """
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(timeout):  # no extra task, unlike wait_for
            await wake.wait()
    return wake.is_set()
