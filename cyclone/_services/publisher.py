"""The publisher: sends the NOTIFY that wakes workers, after the writes it announces commit.

At most one NOTIFY statement is in flight: payloads that arrive meanwhile go out together in
the next one, and with a coalescing window (``notify_coalesce``) everything published within
it goes out as one statement when it closes. The ends of runs a worker completed
(:meth:`Publisher.announce`) may also wait, up to :data:`ENDS_LAG`, for company: each
NOTIFY is a durable commit of its own, and under load one would otherwise follow every
batch. An insert that commits on its own may carry its NOTIFY in its own statement instead
(:meth:`Publisher.carrying`), one at a time. This process's own listeners (an embedded
worker, run waiters) get each statement's payloads as it is sent, not when the server sends
them back (:meth:`cyclone._services.notifier.Notifier.ahead`). The background flushes keep their
connection from one NOTIFY to the next (:class:`cyclone._services.database.Held`), until
:meth:`Publisher.settle` when a worker stops.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections.abc import Iterable, Iterator

from cyclone._model.errors import InvalidStateError
from cyclone._model.wakeups import Wakeups
from cyclone._services.database import Database, Held
from cyclone._services.loops import wait_woken
from cyclone._services.notifier import Notifier, queue_payload, run_payloads
from cyclone._services.transitions import Effects
from cyclone._storage import queries as db

logger = logging.getLogger("cyclone")

ENDS_LAG = 0.05
"""Seconds after the last NOTIFY before run ends published with :meth:`Publisher.announce`
go out on their own (with nothing else to send, and no coalescing window): sooner, they wait
for the next NOTIFY. A run end with no NOTIFY that recent goes out at once."""


class Publisher:
    """Wakeups of one schema's ``channel``, sent through ``database`` (see the module)."""

    def __init__(
        self,
        database: Database,
        channel: str,
        *,
        coalesce: float,
        notifier: Notifier | None = None,
    ) -> None:
        self.database = database
        self.channel = channel
        self.coalesce = coalesce
        self.notifier = notifier  # this process's listener on ``channel``, if any
        self._pending: set[str] = set()
        self._due = asyncio.Event()  # something pending may not wait for company
        self._sent_at = -math.inf  # when the last NOTIFY went out (the event loop's clock)
        self._flush_task: asyncio.Task[None] | None = None
        self._closing = asyncio.Event()
        self._notifying = 0  # inserts in flight that carry their own NOTIFY
        self._early: set[str] = set()  # run ends dispatched here before their NOTIFY went out
        # The background flushes' connection, kept from one NOTIFY to the next: under load a
        # worker's run ends go out every ENDS_LAG, and giving a connection back to the pool
        # after each would cost a reset round trip each time.
        self._connection = Held(database)

    def publish(self, payloads: Iterable[str], *, ends: Iterable[str] = ()) -> None:
        """Send ``payloads`` soon, without waiting: at most one NOTIFY statement is in flight,
        and payloads that arrive meanwhile go out together in the next one. ``ends`` may wait
        for company (:data:`ENDS_LAG`)."""
        before = len(self._pending)
        self._pending.update(payloads)
        if len(self._pending) > before:
            self._due.set()
        self._pending.update(ends)
        if self._pending and (self._flush_task is None or self._flush_task.done()):
            self._flush_task = asyncio.get_running_loop().create_task(
                self._flush_soon(), name="cyclone-publish"
            )

    def announce(self, effects: Effects) -> None:
        """Publish what a worker's committed outcome write changed: its queue wakeups soon,
        the ends of its runs within :data:`ENDS_LAG` (to this process's listeners, such as
        the waiters of an embedded worker's runs, at once)."""
        ends = run_payloads(effects.ended)
        if ends and self.notifier is not None and self.notifier.ahead(ends):
            self._early.update(ends)
        self.publish([queue_payload(q) for q in sorted(effects.queues)], ends=ends)

    def wake(self, queues: Iterable[str]) -> None:
        """Publish a wakeup for each of ``queues``."""
        self.publish([queue_payload(q) for q in sorted(queues)])

    async def publish_wakeups(self, wakeups: Wakeups) -> None:
        """What ``Client.publish_wakeups`` does (its docstring says when it returns)."""
        queues = wakeups.take()
        if not queues:
            return
        payloads = [queue_payload(q) for q in queues]
        if self.coalesce > 0 or not self.database.has_room():
            self.publish(payloads)
            return
        if self._flush_task is None or self._flush_task.done():
            # Nothing in flight: send it from here, without a task hop.
            self._pending.update(payloads)
            await self._flush()
            return
        self.publish(payloads)
        await asyncio.shield(self._flush_task)

    async def committed(self, wakeups: Wakeups, conn: db.Conn) -> None:
        """Publish ``wakeups`` of a transaction just committed on ``conn``: without a
        coalescing window on ``conn`` itself, in hand, so the publish needs no second
        connection from the pool."""
        if self.coalesce > 0:
            await self.publish_wakeups(wakeups)
        else:
            await self.send(sorted(queue_payload(q) for q in wakeups.take()), conn)

    @contextlib.contextmanager
    def carrying(self, queue: str) -> Iterator[tuple[str, str] | None]:
        """The (channel, payload) an insert that commits on its own may send itself, or None.

        Its NOTIFY is delivered at its commit. One at a time: the server serializes notifying
        commits through their WAL flush, so while one is in flight the others publish after
        their commit, merged (:meth:`publish`).
        """
        if self.coalesce > 0 or self._notifying:
            yield None
            return
        self._notifying += 1
        try:
            yield self.channel, queue_payload(queue)
        finally:
            self._notifying -= 1

    async def aclose(self) -> None:
        """Send the wakeups still held by the coalescing window."""
        self._closing.set()
        self._due.set()
        if self._flush_task is not None:
            await asyncio.shield(self._flush_task)
        while self._pending:
            await self._flush()
        self._connection.release()

    async def settle(self, timeout: float) -> None:
        """Send the run ends waiting for company now (waiting up to ``timeout`` seconds for
        that), and give back the connection the background flushes keep: a worker stopped,
        and none of its connections stays taken."""
        task = self._flush_task
        if task is not None and not task.done():
            self._due.set()
            await asyncio.wait([task], timeout=timeout)  # not cancelled after that: sent later
        self._connection.give_back()

    async def _flush_soon(self) -> None:
        # Every batch waits out its window, also those that gathered while the last NOTIFY
        # was in flight (until the client closes: then at once). Without a window, run ends
        # alone wait for company until ENDS_LAG after the last NOTIFY.
        loop = asyncio.get_running_loop()
        while self._pending:
            if self.coalesce > 0 and not self._closing.is_set():
                await wait_woken(self._closing, self.coalesce)
            elif not self._due.is_set():
                lag = self._sent_at + ENDS_LAG - loop.time()
                if lag > 0:
                    await wait_woken(self._due, lag)
            await self._flush(held=True)

    async def _flush(self, *, held: bool = False) -> None:
        payloads, self._pending = sorted(self._pending), set()
        self._due.clear()
        self._sent_at = asyncio.get_running_loop().time()
        await self.send(payloads, held=held)

    async def send(
        self, payloads: list[str], conn: db.Conn | None = None, *, held: bool = False
    ) -> None:
        """One NOTIFY statement for ``payloads`` now: on ``conn``; else, with ``held``, on
        the connection the background flushes keep; else on a pooled connection.

        A failure is logged, never raised: polling picks the work up.
        """
        if not payloads:
            return
        q = self.database.queries
        # The work is committed: this process's listeners need not wait for the round trip.
        early = self._early.intersection(payloads)
        self._early.difference_update(early)
        rest = [p for p in payloads if p not in early]
        ahead = self.notifier is not None and self.notifier.ahead(rest)
        try:
            if conn is not None:
                await db.wakeup_notify(conn, q, self.channel, payloads)
            elif held:
                async with self._connection.use() as kept:
                    await db.wakeup_notify(kept, q, self.channel, payloads)
            else:
                async with self.database.borrow() as pooled:
                    await db.wakeup_notify(pooled, q, self.channel, payloads)
        except BaseException as exc:
            if self.notifier is not None:  # sent or not: let a notification through
                self.notifier.not_sent([*(rest if ahead else ()), *early])
            if not isinstance(exc, (*db.DATABASE_ERRORS, InvalidStateError)):
                raise
            logger.warning(
                "publishing %d wakeups failed (%s); polling will pick the work up",
                len(payloads),
                exc,
            )
