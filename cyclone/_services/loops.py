"""How the background loops wait between passes: a queue's producer and the schedule timer
until woken or a timeout, whichever comes first, with the poll jittered; a worker's
heartbeat and maintenance every so many seconds, carrying on after a database failure."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import random
from collections.abc import Awaitable, Callable

from cyclone._storage import queries as db

logger = logging.getLogger("cyclone")


def jittered(interval: float) -> float:
    """``interval`` less up to a fifth at random, so that processes started together do not
    poll together."""
    return interval * random.uniform(0.8, 1.0)


RETRY_FIRST = 0.05
"""Seconds before the first retry of a statement whose connection was cut."""


def retry_delay(failures: int, cap: float, *, jitter: bool = True) -> float:
    """Seconds before trying again after ``failures`` failures in a row: from
    :data:`RETRY_FIRST`, doubling up to ``cap``; with ``jitter``, anywhere in its upper
    half, so that the processes a fault cut off together do not come back together."""
    delay = min(cap, RETRY_FIRST * 2.0 ** (failures - 1))
    return delay * random.uniform(0.5, 1.0) if jitter else delay


async def wait_woken(wake: asyncio.Event, timeout: float) -> bool:
    """Wait until ``wake`` is set or ``timeout`` seconds have passed; whether it was set.

    The caller clears ``wake`` before its pass, so a wakeup during the pass is not lost.
    """
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(timeout):  # no extra task, unlike wait_for
            await wake.wait()
    return wake.is_set()


class Poll:
    """A loop's wait between passes: until ``wake`` is set, or a timeout after the wait
    began or after the last :meth:`restart`, whichever is later (a pass made outside the
    loop, as by a wakeup handled where it came, counts as one)."""

    def __init__(self, wake: asyncio.Event) -> None:
        self.wake = wake
        self._restarted_at = -math.inf

    def restart(self) -> None:
        """A pass was made outside the loop: the timeout counts from now."""
        self._restarted_at = asyncio.get_running_loop().time()

    async def wait(self, timeout: Callable[[], float]) -> None:
        """Until woken, or ``timeout()`` seconds after this wait or the last restart."""
        loop = asyncio.get_running_loop()
        while True:
            since = loop.time()
            if await wait_woken(self.wake, timeout()) or self._restarted_at <= since:
                return


async def every(
    interval: float,
    work: Callable[[], Awaitable[float | None]],
    *,
    jitter: bool = False,
    first: float | None = None,
    what: str,
    worker_id: str,
) -> None:
    """Run ``work`` every ``interval`` seconds (:func:`jittered` if ``jitter``; the first
    time after ``first`` seconds if given) until cancelled, or sooner when a pass returns
    the seconds to wait before the next one; a failed pass is logged as worker
    ``worker_id``'s ``what`` failing, and the next pass tries again. Supervised: whatever a
    pass raises, the loop goes on (a heartbeat that stopped would let other workers reclaim
    attempts that are still running)."""
    wait = interval if first is None else first
    while True:
        await asyncio.sleep(jittered(wait) if jitter else wait)
        wait = interval
        try:
            wait = await work() or interval
        except db.DATABASE_ERRORS as exc:
            logger.warning(
                "worker %s: %s failed: %s; trying again at the next pass, in about %.3g s",
                worker_id,
                what,
                exc,
                interval,
                extra={"worker": worker_id},
            )
        except Exception as exc:  # a bug, or a closing pool: say so, and keep the loop alive
            logger.error(
                "worker %s: %s failed: %s: %s; trying again at the next pass, in about %.3g s",
                worker_id,
                what,
                type(exc).__name__,
                exc,
                interval,
                exc_info=exc,
                extra={"worker": worker_id},
            )
