"""Wakeups: which queues got claimable work in a transaction, published after it commits.

Cyclone never sends NOTIFY inside a caller's transaction: a NOTIFY there can make the commit
fail when the server's notification queue is full, and a notification sent before the commit
would wake workers that cannot see the work yet. Instead the caller tracks its transaction
with :func:`track_wakeups`, commits, and then calls ``client.publish_wakeups``.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator
from types import TracebackType
from typing import TYPE_CHECKING, Any, overload

from cyclone._enqueue.adapters import adapter_for
from cyclone._model.errors import LifecycleError
from cyclone._model.wakeups import Wakeups
from cyclone._services.resource import AsyncResource
from cyclone._storage.queries.conn import Conn

if TYPE_CHECKING:
    import psycopg
    from sqlalchemy.ext.asyncio import AsyncSession
    from sqlalchemy.orm import Session

    from cyclone._services.publisher import Publisher

logger = logging.getLogger("cyclone")


class WakeupFrames:
    """The wakeups of a tracked connection: one frame per open block, kept only if it commits."""

    def __init__(self, wakeups: Wakeups) -> None:
        self._wakeups = wakeups
        self._frames: list[set[str]] = []

    @property
    def wakeups(self) -> Wakeups:
        """The :class:`Wakeups` that committed blocks on this connection fill."""
        return self._wakeups

    def record(self, queue: str) -> None:
        """Record that ``queue`` gets claimable work when the transaction commits."""
        if self._frames:
            self._frames[-1].add(queue)
        else:
            self._wakeups.add(queue)

    def open_frame(self) -> None:
        """A transaction block began: record into a frame of its own."""
        self._frames.append(set())

    def close_frame(self, *, keep: bool) -> None:
        """The innermost block ended: keep its wakeups (committed) or drop them."""
        frame = self._frames.pop()
        if keep:
            for queue in frame:
                self.record(queue)


class TrackedConnection(WakeupFrames):
    """A connection whose Cyclone writes record wakeups; it stands in wherever a ``tx`` goes.

    Everything but ``transaction()`` is passed through to the wrapped asyncpg connection.
    Wakeups recorded inside a ``transaction()`` block are kept only if the block commits; a
    nested block is a savepoint with the same rule.
    """

    def __init__(self, conn: Conn, wakeups: Wakeups) -> None:
        super().__init__(wakeups)
        self._conn = conn

    @property
    def connection(self) -> Conn:
        """The wrapped asyncpg connection."""
        return self._conn

    def transaction(self, **kwargs: Any) -> TrackedTransaction:
        """Like ``asyncpg.Connection.transaction``; a nested one is a savepoint."""
        return TrackedTransaction(self, self._conn.transaction(**kwargs))

    def is_in_transaction(self) -> bool:
        """Whether the wrapped connection has an open transaction."""
        return self._conn.is_in_transaction()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)


class TrackedTransaction(AsyncResource):
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
        self._owner.open_frame()
        self._open = True

    async def commit(self) -> None:
        """Commit; the block's wakeups are kept only if the commit succeeds."""
        self._require_open()
        self._open = False
        try:
            await self._tx.commit()
        except BaseException:
            self._owner.close_frame(keep=False)
            raise
        self._owner.close_frame(keep=True)

    async def rollback(self) -> None:
        """Roll back and discard the block's wakeups."""
        self._require_open()
        self._open = False
        self._owner.close_frame(keep=False)
        await self._tx.rollback()

    def _require_open(self) -> None:
        if not self._open:
            raise LifecycleError("this tracked transaction is not open")

    async def _begin(self) -> None:
        await self.start()

    async def _end(self, failed: bool) -> None:
        await (self.rollback() if failed else self.commit())


@overload
def track_wakeups(conn: Conn | TrackedConnection) -> tuple[TrackedConnection, Wakeups]: ...
@overload
def track_wakeups(conn: AsyncSession) -> tuple[AsyncSession, Wakeups]: ...
@overload
def track_wakeups(conn: Session) -> tuple[Session, Wakeups]: ...
def track_wakeups(conn: Any) -> tuple[Any, Wakeups]:
    """Wrap ``conn`` so that Cyclone's ``*_tx`` calls on it record wakeups.

    Returns the tracked connection (pass it as ``tx``) and the :class:`Wakeups` it fills.
    Publish them with ``client.publish_wakeups(wakeups)`` after the commit. A SQLAlchemy
    ``AsyncSession`` (or ``Session``) is its own tracked connection, for one transaction: the
    one open in it (the innermost, a savepoint included), or else the next one it begins.
    That transaction's committed wakeups fill the :class:`Wakeups` instead of being published
    at its commit; later transactions of the session are not tracked by it. Inside it, a
    ``client.transaction(session)`` block or another ``track_wakeups`` takes the wakeups
    written from there on, until it ends: the innermost tracker gets each wakeup.
    """
    if not isinstance(conn, Conn | TrackedConnection):
        adapter, wakeups = adapter_for(conn), Wakeups()
        if adapter is not None and adapter.track(conn, wakeups):
            return conn, wakeups
    if isinstance(conn, TrackedConnection):
        conn = conn.connection
    wakeups = Wakeups()
    return TrackedConnection(conn, wakeups), wakeups


@contextlib.asynccontextmanager
async def tracked_transaction(
    publisher: Publisher, conn: Conn | TrackedConnection
) -> AsyncIterator[TrackedConnection]:
    """Run a tracked transaction on ``conn``; its wakeups are published by ``publisher`` after
    the commit.

    Without a coalescing window they go out on ``conn`` itself, just committed and in
    hand, so the publish needs no second connection from the pool. Given a tracked
    connection whose transaction is open, the block is a savepoint whose wakeups join
    that transaction's, for its owner to publish after the outer commit. Inside an
    untracked transaction of the caller's, nothing tells when that one commits: the
    wakeups go out through the pool when the block ends, before that commit, and the
    work waits for the workers' next poll.
    """
    if isinstance(conn, TrackedConnection):
        ttx, wakeups = conn, conn.wakeups
    else:
        ttx, wakeups = track_wakeups(conn)
    async with ttx.transaction():
        yield ttx
    if ttx.is_in_transaction():
        if ttx is not conn:  # an untracked outer transaction
            await publisher.publish_wakeups(wakeups)
    else:
        await publisher.committed(wakeups, ttx.connection)


class SyncTrackedConnection(WakeupFrames):
    """A psycopg connection whose Cyclone writes record wakeups (``cyclone.sync``).

    ``transaction()`` is psycopg's (a context manager; a nested one is a savepoint), with the
    same rule for wakeups as :class:`TrackedConnection`; everything else is passed through.
    """

    def __init__(self, conn: psycopg.Connection[Any], wakeups: Wakeups) -> None:
        super().__init__(wakeups)
        self._conn = conn

    @property
    def connection(self) -> psycopg.Connection[Any]:
        """The wrapped psycopg connection."""
        return self._conn

    def transaction(self, **kwargs: Any) -> SyncTrackedTransaction:
        """Like ``psycopg.Connection.transaction``; a nested one is a savepoint."""
        return SyncTrackedTransaction(self, self._conn.transaction(**kwargs))

    def is_in_transaction(self) -> bool:
        """Whether the psycopg connection has a transaction open on the server."""
        from psycopg import pq

        return self._conn.info.transaction_status != pq.TransactionStatus.IDLE

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)


class SyncTrackedTransaction:
    """A transaction (or savepoint) of a :class:`SyncTrackedConnection`."""

    def __init__(self, owner: SyncTrackedConnection, tx: Any) -> None:
        self._owner = owner
        self._tx = tx

    def __enter__(self) -> SyncTrackedTransaction:
        self._tx.__enter__()
        self._owner.open_frame()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        try:
            suppressed = bool(self._tx.__exit__(exc_type, exc, tb))
        except BaseException:
            self._owner.close_frame(keep=False)
            raise
        self._owner.close_frame(keep=exc_type is None)
        return suppressed
