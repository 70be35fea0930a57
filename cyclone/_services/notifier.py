"""The LISTEN side of wakeups: one dedicated connection per client, outside the pool.

asyncpg's pool resets a connection with ``UNLISTEN *`` when it is released, so a listener
cannot live on a pooled connection. The notifier opens its own connection with the pool's
connect arguments, reconnects after a failure, and fans notifications out to subscribers:
workers (queue wakeups) and run waiters (run ended). Notifications are hints; every
subscriber also polls, so a lost notification only delays.

What this process itself is about to NOTIFY is dispatched here at once (:meth:`Notifier.ahead`),
without waiting for the server to send it back: an embedded worker claims while the NOTIFY
is still on its way to the others, and the notification, when it comes back, is skipped.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import asyncpg

from cyclone._services import loops
from cyclone._storage.queries import DATABASE_ERRORS

logger = logging.getLogger("cyclone")

QUEUE_PREFIX = "q:"
RUN_PREFIX = "r:"
STREAM_PREFIX = "s:"


def queue_payload(queue: str) -> str:
    """The payload that wakes workers of ``queue``."""
    return QUEUE_PREFIX + queue


# NOTIFY payloads must stay under 8000 bytes: 200 run ids of 36 characters and a comma each.
_RUNS_PER_PAYLOAD = 200


def run_payloads(run_ids: Iterable[uuid.UUID]) -> list[str]:
    """Payloads that wake waiters of runs that ended, many runs to a payload."""
    ids = sorted(str(r) for r in run_ids)
    return [
        RUN_PREFIX + ",".join(ids[i : i + _RUNS_PER_PAYLOAD])
        for i in range(0, len(ids), _RUNS_PER_PAYLOAD)
    ]


def stream_payload(run_id: uuid.UUID) -> str:
    """The payload that wakes readers of a run's stream and progress."""
    return STREAM_PREFIX + str(run_id)


async def connect_like(pool: asyncpg.Pool) -> asyncpg.Connection:
    """A new connection outside ``pool`` with the pool's own connect arguments."""
    # asyncpg keeps these private; they are what the pool itself connects with.
    args: Any = pool._connect_args  # type: ignore[attr-defined]
    kwargs: Any = pool._connect_kwargs  # type: ignore[attr-defined]
    conn: asyncpg.Connection = await asyncpg.connect(*args, **kwargs)
    return conn


class Notifier:
    """Listens on the client's channel and dispatches queue and run notifications; a lost
    connection is made again at once, then backing off up to ``retry_delay`` seconds."""

    def __init__(
        self,
        pool: asyncpg.Pool,
        channel: str,
        *,
        retry_delay: float = 1.0,
        listen_dsn: str | None = None,
    ) -> None:
        self._pool = pool
        self._listen_dsn = listen_dsn
        self._channel = channel
        self._retry_delay = retry_delay
        self._queue_subscribers: list[Callable[[str], None]] = []
        self._all_subscribers: list[Callable[[str], None]] = []
        self._run_waiters: dict[str, set[asyncio.Event]] = {}
        self._task: asyncio.Task[None] | None = None
        self._connected = asyncio.Event()
        self._users = 0
        # Payloads dispatched ahead of their own NOTIFY: that many of their notifications are
        # this process's own, coming back, and are skipped. Any notification of the payload
        # will do: it wakes the same subscribers after a commit, ours or another's.
        self._ahead: Counter[str] = Counter()

    @property
    def connected(self) -> asyncio.Event:
        """Set while the LISTEN connection is up."""
        return self._connected

    def subscribe_queues(self, callback: Callable[[str], None]) -> Callable[[], None]:
        """Call ``callback(queue)`` on each queue wakeup; returns an unsubscribe function."""
        self._queue_subscribers.append(callback)
        return lambda: self._queue_subscribers.remove(callback)

    def subscribe_all(self, callback: Callable[[str], None]) -> Callable[[], None]:
        """Call ``callback(payload)`` on every notification but a run stream's, and with
        ``""`` after a reconnect (for live views); returns an unsubscribe function."""
        self._all_subscribers.append(callback)
        return lambda: self._all_subscribers.remove(callback)

    async def connect(self) -> asyncpg.Connection:
        """A new session by the listener's route: ``listen_dsn``, else the pool's arguments
        (never a pooler in transaction mode, which the pool check refuses for a listener)."""
        if self._listen_dsn is None:
            return await connect_like(self._pool)
        conn: asyncpg.Connection = await asyncpg.connect(self._listen_dsn)
        return conn

    def watch_run(self, run_id: uuid.UUID) -> asyncio.Event:
        """An event set when a run-ended notification for ``run_id`` arrives."""
        event = asyncio.Event()
        self._run_waiters.setdefault(str(run_id), set()).add(event)
        return event

    def unwatch_run(self, run_id: uuid.UUID, event: asyncio.Event) -> None:
        """Stop watching (always pair with :meth:`watch_run`)."""
        waiters = self._run_waiters.get(str(run_id))
        if waiters is not None:
            waiters.discard(event)
            if not waiters:
                del self._run_waiters[str(run_id)]

    def watch_stream(self, run_id: uuid.UUID) -> asyncio.Event:
        """An event set when the run's stream or progress is written, or the run ends."""
        event = self.watch_run(run_id)
        self._run_waiters.setdefault(stream_payload(run_id), set()).add(event)
        return event

    def unwatch_stream(self, run_id: uuid.UUID, event: asyncio.Event) -> None:
        """Stop watching (always pair with :meth:`watch_stream`)."""
        self.unwatch_run(run_id, event)
        waiters = self._run_waiters.get(stream_payload(run_id))
        if waiters is not None:
            waiters.discard(event)
            if not waiters:
                del self._run_waiters[stream_payload(run_id)]

    def acquire(self) -> None:
        """Start listening if nobody else has; pair with :meth:`release`."""
        self._users += 1
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(
                self._run(), name="cyclone-notifier"
            )

    async def release(self) -> None:
        """Stop listening when the last user releases."""
        self._users -= 1
        if self._users == 0 and self._task is not None:
            task, self._task = self._task, None
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def ahead(self, payloads: Sequence[str]) -> bool:
        """Dispatch ``payloads``, whose NOTIFY this process sends next, now; their
        notifications are skipped when they arrive. Does nothing and returns False while not
        listening (nothing would come back to skip)."""
        if not self._connected.is_set():
            return False
        for payload in payloads:
            self._ahead[payload] += 1
            self._dispatch(payload)
        return True

    def not_sent(self, payloads: Sequence[str]) -> None:
        """The NOTIFY of ``payloads`` dispatched :meth:`ahead` failed: none comes back."""
        for payload in payloads:
            self._came_back(payload)

    def _came_back(self, payload: str) -> bool:
        """Whether ``payload`` was one dispatched ahead, now accounted for."""
        count = self._ahead.get(payload, 0)
        if count > 1:
            self._ahead[payload] = count - 1
        elif count:
            del self._ahead[payload]
        return count > 0

    def _dispatch(self, payload: str) -> None:
        if payload.startswith(STREAM_PREFIX):  # many, and only for the run's own readers
            for event in self._run_waiters.get(payload, ()):
                event.set()
            return
        for every in list(self._all_subscribers):
            every(payload)
        if payload.startswith(QUEUE_PREFIX):
            queue = payload[len(QUEUE_PREFIX) :]
            for callback in list(self._queue_subscribers):
                callback(queue)
        elif payload.startswith(RUN_PREFIX) and self._run_waiters:
            for run_id in payload[len(RUN_PREFIX) :].split(","):
                for event in self._run_waiters.get(run_id, ()):
                    event.set()

    def _wake_everyone(self) -> None:
        # After a reconnect, notifications sent while we were away are lost: poll now.
        for callback in [*self._queue_subscribers, *self._all_subscribers]:
            callback("")
        for events in self._run_waiters.values():
            for event in events:
                event.set()

    async def _run(self) -> None:
        def on_notify(conn: Any, pid: int, channel: str, payload: object) -> None:
            text = str(payload)
            if not (self._ahead and self._came_back(text)):
                self._dispatch(text)

        failures = 0  # connections lost or failed in a row: the reconnects back off
        while True:
            conn: asyncpg.Connection | None = None
            try:
                conn = await self.connect()
                lost = asyncio.Event()
                conn.add_termination_listener(lambda _c, lost=lost: lost.set())
                await conn.add_listener(self._channel, on_notify)
                failures = 0
                self._ahead.clear()  # what was sent while away does not come back
                self._connected.set()
                self._wake_everyone()
                await lost.wait()
                logger.warning(
                    "LISTEN connection on channel %s lost; reconnecting at once (polling "
                    "picks up work meanwhile)",
                    self._channel,
                    extra={"channel": self._channel},
                )
            except asyncio.CancelledError:
                raise
            except DATABASE_ERRORS as exc:
                logger.warning(
                    "LISTEN connection on channel %s failed: %s; trying again in %.3g s at "
                    "most (polling picks up work meanwhile)",
                    self._channel,
                    exc,
                    loops.retry_delay(failures + 1, self._retry_delay, jitter=False),
                    extra={"channel": self._channel},
                )
            finally:
                self._connected.clear()
                if conn is not None:
                    conn.terminate()  # no round trip: the connection may be dead already
            failures += 1
            await asyncio.sleep(loops.retry_delay(failures, self._retry_delay))
