"""Plain ``def`` handlers: each runs in a thread, at most ``threads`` of them at once.

The event loop stays free while a thread blocks, so leases are renewed, cancels are seen
and other handlers run. A thread cannot be interrupted: when its attempt ends first (its
``timeout``, a cancelled run, a lost lease, a worker shutting down), the attempt ends at once
(``abandon_on_cancel``), the context reports ``cancelled``, and the thread runs on until the
handler returns, its result discarded. It keeps its slot of the limiter until then, so
``threads`` bounds the threads running handler code, abandoned ones included.

::

    slot of the limiter (waits while ``threads`` are busy)
      └─> queued to anyio's thread pool ─> started (the handler runs) ─> returned: slot freed
      └─> the attempt ended before it started: it never starts, the slot is freed at once
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Callable
from typing import TypeVar, cast

import anyio
import anyio.to_thread

from cyclone._model.context import HandlerScope
from cyclone._model.options import validate_int
from cyclone._worker.outcomes import Claimed

logger = logging.getLogger("cyclone")

T = TypeVar("T")

_busy_lock = threading.Lock()
_busy = 0  # handler threads running in this process, abandoned ones included


def busy_threads() -> int:
    """How many handler threads of any worker in this process are still running handler
    code (after a shutdown: those abandoned, whose handler has not returned yet)."""
    with _busy_lock:
        return _busy


def _count(delta: int) -> None:
    global _busy
    with _busy_lock:
        _busy += delta


class _Start:
    """Who decides whether a queued handler runs: the thread starting it, or the attempt
    ending before the thread took it up. Whichever comes first wins, under the lock."""

    __slots__ = ("_lock", "_state")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._state = "queued"

    def begin(self) -> bool:
        with self._lock:
            if self._state == "queued":
                self._state = "started"
            return self._state == "started"

    def withdraw(self) -> bool:
        """True if the handler had not started: it never will."""
        with self._lock:
            if self._state == "queued":
                self._state = "withdrawn"
            return self._state == "withdrawn"


class HandlerThreads:
    """Runs the plain ``def`` handlers of one worker, ``threads`` at once at most."""

    def __init__(self, threads: int) -> None:
        self.threads = validate_int(threads, what="threads", low=1)
        self.limiter = anyio.CapacityLimiter(threads)
        """Held by each handler thread from before it starts until its handler returns."""
        # Passed to anyio for its own count, which an abandoned thread leaves at once: never
        # more than ``limiter`` holds, so it never makes a handler wait.
        self._pool = anyio.CapacityLimiter(threads)

    async def run(self, claimed: Claimed, scope: HandlerScope, call: Callable[[], T]) -> T:
        """Run ``call`` (the handler, its arguments bound) in a thread with a slot of the
        limiter. Cancelled, it returns at once; the thread runs on (see the module)."""
        holder = object()
        if self.limiter.available_tokens < 1:
            logger.debug(
                "%s waits for a thread: all %d are busy",
                claimed,
                self.threads,
                extra=claimed.log_fields(),
            )
        await self.limiter.acquire_on_behalf_of(holder)
        loop = asyncio.get_running_loop()
        start = _Start()

        def release() -> None:  # in the event loop
            self.limiter.release_on_behalf_of(holder)
            if scope.cancelled:
                logger.info(
                    "%s: its abandoned handler thread returned; its result is discarded",
                    claimed,
                    extra=claimed.log_fields(),
                )

        def in_thread() -> T | None:
            if not start.begin():
                return None  # the attempt ended before this thread took it up
            scope.enter_thread()
            _count(1)
            try:
                return call()
            finally:
                _count(-1)
                # A closed loop (the worker's process is ending) has no one left to wait
                # for the slot, nor to log.
                with contextlib.suppress(RuntimeError):
                    loop.call_soon_threadsafe(release)

        try:
            result = await anyio.to_thread.run_sync(
                in_thread, abandon_on_cancel=True, limiter=self._pool
            )
        except asyncio.CancelledError:
            scope.abandon()
            if start.withdraw():  # it never runs: its slot is free now
                self.limiter.release_on_behalf_of(holder)
            else:
                logger.warning(
                    "%s ended while its handler runs in a thread, which cannot be "
                    "interrupted: the thread runs on (ctx.cancelled is now true) and keeps "
                    "its thread slot until the handler returns",
                    claimed,
                    extra=claimed.log_fields(),
                )
            raise
        return cast("T", result)  # None only when withdrawn, which raised above
