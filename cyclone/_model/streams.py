"""Progress and streams: the read model of a stream's items, what a context needs to write
them (:class:`StreamWriter`), and the throttle of one attempt's progress (:class:`Reporter`).

A handler's progress is overwritten (the latest report wins) and written at most once per
:data:`REPORT_INTERVAL` per attempt; a report made sooner waits in the reporter, replaced
by any later one, and is written when the interval has passed or when the handler returns,
whichever comes first::

    report ──> idle ──(interval passed since the last write)──> written now
                └──(sooner)──> pending ──(interval passes, or the handler returns)──> written

A stream item is written by the ``ctx.stream()`` call that makes it: once the call returns
the item is durable, with its offset.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
import math
import uuid
from collections.abc import AsyncGenerator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

logger = logging.getLogger("cyclone")

REPORT_INTERVAL = 0.25
"""Seconds between two progress writes of one attempt, at the least."""

VALUE_LIMIT = 256 * 1024
"""The most bytes one encoded progress value or stream item may take."""


@dataclass(frozen=True, slots=True)
class StreamItem:
    """One item of a run's stream: its ``offset`` (1 for the first item of the run, one more
    for each next one, whichever node wrote it), the ``node`` and ``attempt`` that wrote it
    (a job's node is its kind), its ``value`` (decoded as plain JSON) and when it was
    written."""

    offset: int
    node: str
    attempt: int
    value: Any
    created_at: dt.datetime


class StreamWriter(Protocol):
    """What a context writes progress and stream items with
    (``cyclone._services.streams.Streams``, or the test kit's ``StreamRecorder``); values
    arrive encoded as JSON text. ``report_interval``: the seconds a context's progress
    writes keep apart."""

    @property
    def report_interval(self) -> float:
        """Seconds between two progress writes of one attempt, at the least."""
        ...

    async def append(self, run_id: uuid.UUID, node: str, attempt: int, item: str) -> int:
        """Append one item to the run's stream; its offset."""
        ...

    async def report(self, run_id: uuid.UUID, node: str, attempt: int, value: str) -> None:
        """Overwrite the node's progress."""
        ...


class StreamReader(Protocol):
    """What a run handle reads progress and streams with
    (``cyclone._services.streams.Streams``)."""

    async def progress(self, run_id: uuid.UUID) -> dict[str, Any]:
        """The latest progress of each node, by node."""
        ...

    def items(
        self, run_id: uuid.UUID, after: int, node: str | None
    ) -> AsyncGenerator[StreamItem, None]:
        """The run's stream items past ``after`` until the run ends."""
        ...


class Reporter:
    """One attempt's progress writes through ``write`` (an encoded value), at most one per
    ``interval`` seconds (see the module)."""

    def __init__(
        self, write: Callable[[str], Awaitable[None]], interval: float = REPORT_INTERVAL
    ) -> None:
        self._write = write
        self._interval = interval
        self._last = -math.inf  # when the last write began (the event loop's clock)
        self._pending: str | None = None
        self._timer: asyncio.Task[None] | None = None
        self._now = asyncio.Event()  # the handler returned: the timer writes at once
        self._lock = asyncio.Lock()  # one write at a time, in the order they were made

    async def report(self, encoded: str) -> None:
        """Record ``encoded`` as the latest progress; write it now if the interval passed."""
        self._pending = encoded
        if self._timer is not None:
            return  # the timer writes the latest pending value when it fires
        loop = asyncio.get_running_loop()
        wait = self._last + self._interval - loop.time()
        if wait <= 0:
            await self._flush()
        else:
            self._timer = loop.create_task(self._later(wait), name="cyclone-progress")

    async def settle(self) -> None:
        """The handler returned: write what is pending now. A failed write is logged, not
        raised: the attempt's outcome does not depend on its progress."""
        timer = self._timer
        if timer is not None:
            self._now.set()
            await asyncio.shield(timer)
            return
        try:
            await self._flush()
        except Exception:
            logger.warning("writing the last progress report failed", exc_info=True)

    async def _later(self, delay: float) -> None:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(delay):
                await self._now.wait()
        self._timer = None
        try:
            await self._flush()
        except Exception:  # a supervised background write: nobody awaits it
            logger.warning("writing a progress report failed", exc_info=True)

    async def _flush(self) -> None:
        async with self._lock:
            encoded, self._pending = self._pending, None
            if encoded is None:
                return
            self._last = asyncio.get_running_loop().time()
            await self._write(encoded)
