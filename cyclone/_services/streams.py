"""The streams service: progress and stream items, written for handlers' contexts and read
for run handles and the dashboard.

Each write is a short statement of its own on a pooled connection, never the completion
transaction: what a handler reported or streamed stays when its attempt fails, and shows
while it runs. After each write the publisher announces the run's stream (``s:<run id>``)
so readers wake; a reader also polls, so a lost notification only delays it.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass
from typing import Any

from cyclone._model import codec
from cyclone._model.errors import InvalidStateError, RunNotFoundError
from cyclone._model.handles import RunState
from cyclone._model.keyring import Keyring, reveal, sealed
from cyclone._model.streams import REPORT_INTERVAL, StreamItem
from cyclone._services.database import Database
from cyclone._services.notifier import Notifier, stream_payload
from cyclone._services.publisher import Publisher
from cyclone._storage import queries as db

READ_BATCH = 500  # items a reader fetches per statement
POLL_FIRST = 0.05  # a reader's first poll delay, doubled while nothing comes
POLL_MAX = 1.0  # a reader polls at least this often, whatever notifications do


class Streams:
    """Progress and streams on ``database``; ``publisher`` wakes readers, ``notifier`` (None:
    ``notify=False``) wakes this process's readers; values are sealed with ``cipher``."""

    def __init__(
        self,
        database: Database,
        publisher: Publisher,
        notifier: Notifier | None,
        cipher: Keyring | None = None,
    ) -> None:
        self.database = database
        self.publisher = publisher
        self.notifier = notifier
        self.cipher = cipher
        self.report_interval = REPORT_INTERVAL

    async def append(self, run_id: uuid.UUID, node: str, attempt: int, item: str) -> int:
        """Append one encoded item to the run's stream; its offset. :class:`InvalidStateError`
        when the run has ended (or is gone)."""
        async with self.database.acquire() as conn:
            offsets = await db.stream_append(
                conn, self.database.queries, run_id, node, attempt, f"[{sealed(self.cipher, item)}]"
            )
        if not offsets:
            raise InvalidStateError(
                f"run {run_id} has ended, so its stream is closed: an item streamed after "
                "the run ended is not kept"
            )
        self.publisher.publish([stream_payload(run_id)])
        return offsets[0]

    async def report(self, run_id: uuid.UUID, node: str, attempt: int, value: str) -> None:
        """Overwrite the node's progress with an encoded value."""
        async with self.database.acquire() as conn:
            await db.progress_set(
                conn, self.database.queries, run_id, node, attempt, sealed(self.cipher, value)
            )
        self.publisher.publish([stream_payload(run_id)])

    async def progress(self, run_id: uuid.UUID) -> dict[str, Any]:
        """The latest progress of each node that reported, by node (a job's by its kind)."""
        async with self.database.acquire() as conn:
            rows = await db.progress_get(conn, self.database.queries, run_id)
        if not rows:
            raise RunNotFoundError(run_id)
        return {
            r["node"]: codec.decode(reveal(self.cipher, r["value"]), Any)
            for r in rows
            if r["node"] is not None
        }

    async def read(
        self, run_id: uuid.UUID, after: int, node: str | None, limit: int = READ_BATCH
    ) -> StreamPage:
        """One read of up to ``limit`` items past offset ``after`` (of ``node`` only, unless
        None), with the run's stored state and last offset seen in the same snapshot."""
        async with self.database.acquire() as conn:
            rows = await db.stream_read(conn, self.database.queries, run_id, after, node, limit)
        if not rows:
            raise RunNotFoundError(run_id)
        items = [
            StreamItem(
                offset=r["seq"],
                node=r["node"],
                attempt=r["attempt"],
                value=codec.decode(reveal(self.cipher, r["value"]), Any),
                created_at=r["created_at"],
            )
            for r in rows
            if r["seq"] is not None
        ]
        return StreamPage(items, rows[0]["head"], RunState(rows[0]["state"]).terminal)

    @contextlib.asynccontextmanager
    async def watching(self, run_id: uuid.UUID) -> AsyncIterator[Wake]:
        """A :class:`Wake` for the run's stream while the block runs."""
        notifier = self.notifier
        if notifier is None:
            yield Wake(None)
            return
        notifier.acquire()
        event = notifier.watch_stream(run_id)
        try:
            yield Wake(event)
        finally:
            notifier.unwatch_stream(run_id, event)
            await asyncio.shield(notifier.release())

    async def items(
        self, run_id: uuid.UUID, after: int, node: str | None
    ) -> AsyncGenerator[StreamItem, None]:
        """The run's stream items past offset ``after`` (of ``node`` only, unless None), in
        order, until the run ends. It ends once a read sees the run ended and nothing more
        to read: the run's end and its items are seen in one snapshot, and no item commits
        after the end (``stream_append``)."""
        async with self.watching(run_id) as wake:
            while True:
                wake.arm()
                page = await self.read(run_id, after, node)
                for item in page.items:
                    after = item.offset
                    yield item
                if len(page.items) == READ_BATCH:
                    continue
                if page.ended:
                    return
                await wake.wait(bool(page.items))


@dataclass(frozen=True, slots=True)
class StreamPage:
    """One read of a stream: its ``items``, the run's last offset (``head``) and whether the
    run had ended, all in one snapshot."""

    items: list[StreamItem]
    head: int
    ended: bool


class Wake:
    """Waits for the next write of a run's stream or its end: woken by notifications (none
    with ``notify=False``), polled with a growing delay (at most :data:`POLL_MAX`) as the
    floor. :meth:`arm` before each read, so that a write committed after it wakes the wait."""

    def __init__(self, event: asyncio.Event | None) -> None:
        self._event = event
        self._delay = POLL_FIRST

    def arm(self) -> None:
        """Forget notifications so far (call before reading)."""
        if self._event is not None:
            self._event.clear()

    async def wait(self, found: bool, cap: float = POLL_MAX) -> bool:
        """Wait for a notification or the poll delay (the first one again after a read that
        ``found`` something; never over ``cap``); whether a notification came."""
        self._delay = POLL_FIRST if found else self._delay
        delay, self._delay = min(self._delay, cap), min(self._delay * 2, POLL_MAX)
        if self._event is None:
            await asyncio.sleep(delay)
            return False
        # asyncio.timeout, not wait_for: wait_for (3.11) swallows a cancellation that comes
        # as the event is set, and a reader that was cancelled would read on.
        try:
            async with asyncio.timeout(delay):
                await self._event.wait()
        except TimeoutError:
            return False
        return True
