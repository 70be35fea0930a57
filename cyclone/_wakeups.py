"""Wakeups: which queues got claimable work in a transaction, published after it commits.

Cyclone never sends NOTIFY inside a caller's transaction: a NOTIFY there can make the commit
fail when the server's notification queue is full, and a notification sent before the commit
would wake workers that cannot see the work yet. Instead the caller tracks its transaction
with :func:`track_wakeups`, commits, and then calls ``client.publish_wakeups``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from types import TracebackType
from typing import Any

import asyncpg

logger = logging.getLogger("cyclone")

AnyConnection = asyncpg.Connection | asyncpg.pool.PoolConnectionProxy
"""A plain asyncpg connection, or one acquired from a pool."""


class Wakeups:
    """The distinct queue names that got claimable work in a tracked transaction.

    Supports ``len``, ``bool``, iteration and ``in``. Publishing clears it.
    """

    __slots__ = ("_queues",)

    def __init__(self) -> None:
        self._queues: set[str] = set()

    def __len__(self) -> int:
        return len(self._queues)

    def __bool__(self) -> bool:
        return bool(self._queues)

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self._queues))

    def __contains__(self, queue: object) -> bool:
        return queue in self._queues

    def __repr__(self) -> str:
        return f"Wakeups({sorted(self._queues)!r})"

    def take(self) -> set[str]:
        """Return the queue names and clear them (so a second publish sends nothing)."""
        queues, self._queues = self._queues, set()
        return queues


class TrackedConnection:
    """A connection whose Cyclone writes record wakeups; it stands in wherever a ``tx`` goes.

    Everything but ``transaction()`` is passed through to the wrapped asyncpg connection.
    Wakeups recorded inside a ``transaction()`` block are kept only if the block commits; a
    nested block is a savepoint with the same rule.
    """

    def __init__(self, conn: AnyConnection, wakeups: Wakeups) -> None:
        self._conn = conn
        self._wakeups = wakeups
        self._frames: list[set[str]] = []

    @property
    def connection(self) -> AnyConnection:
        """The wrapped asyncpg connection."""
        return self._conn

    @property
    def wakeups(self) -> Wakeups:
        """The :class:`Wakeups` that committed blocks on this connection fill."""
        return self._wakeups

    def record(self, queue: str) -> None:
        """Record that ``queue`` gets claimable work when the transaction commits."""
        if self._frames:
            self._frames[-1].add(queue)
        else:
            self._wakeups._queues.add(queue)

    def transaction(self, **kwargs: Any) -> TrackedTransaction:
        """Like ``asyncpg.Connection.transaction``; a nested one is a savepoint."""
        return TrackedTransaction(self, self._conn.transaction(**kwargs))

    def is_in_transaction(self) -> bool:
        """Whether the wrapped connection has an open transaction."""
        return self._conn.is_in_transaction()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)

    def _push(self) -> None:
        self._frames.append(set())

    def _pop(self, *, keep: bool) -> None:
        frame = self._frames.pop()
        if keep:
            for queue in frame:
                self.record(queue)


class TrackedTransaction:
    """A transaction (or savepoint) of a :class:`TrackedConnection`.

    Use it as ``async with`` or with ``start``/``commit``/``rollback``, as asyncpg's own.
    """

    def __init__(self, owner: TrackedConnection, tx: Any) -> None:
        self._owner = owner
        self._tx = tx
        self._open = False

    async def start(self) -> None:
        """Begin the transaction (a savepoint when one is already open)."""
        await self._tx.start()
        self._owner._push()
        self._open = True

    async def commit(self) -> None:
        """Commit; the block's wakeups are kept only if the commit succeeds."""
        self._require_open()
        self._open = False
        try:
            await self._tx.commit()
        except BaseException:
            self._owner._pop(keep=False)
            raise
        self._owner._pop(keep=True)

    async def rollback(self) -> None:
        """Roll back and discard the block's wakeups."""
        self._require_open()
        self._open = False
        self._owner._pop(keep=False)
        await self._tx.rollback()

    def _require_open(self) -> None:
        if not self._open:
            raise RuntimeError("this tracked transaction is not open")

    async def __aenter__(self) -> TrackedTransaction:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is None:
            await self.commit()
        else:
            await self.rollback()


def track_wakeups(conn: AnyConnection) -> tuple[TrackedConnection, Wakeups]:
    """Wrap ``conn`` so that Cyclone's ``*_tx`` calls on it record wakeups.

    Returns the tracked connection (pass it as ``tx``) and the :class:`Wakeups` it fills.
    Publish them with ``client.publish_wakeups(wakeups)`` after the commit.
    """
    if isinstance(conn, TrackedConnection):
        conn = conn.connection
    wakeups = Wakeups()
    return TrackedConnection(conn, wakeups), wakeups


Tx = AnyConnection | TrackedConnection
"""What a ``*_tx`` call accepts: an asyncpg connection in a transaction, or a tracked one."""


def unwrap(
    tx: Tx,
) -> tuple[AnyConnection, TrackedConnection | None]:
    """The raw connection behind ``tx``, and its tracker if it has one."""
    if isinstance(tx, TrackedConnection):
        return tx.connection, tx
    return tx, None
