"""SQLAlchemy sessions and connections as the caller's transaction.

Cyclone writes through the driver connection of the session's current transaction (asyncpg for
``AsyncSession``/``AsyncConnection``, psycopg for ``Session``/``Connection``) and never begins,
commits or rolls back. A session's wakeups are kept per (nested) transaction with the session's
own events: a savepoint that rolls back (``begin_nested``) drops its wakeups, one that is
released hands them to its parent, and the outermost commit publishes them. ``after_commit``
fires once the driver's commit returned, so a wakeup never goes out before the work is
visible; ``after_transaction_end`` then tells whether the block ended by commit (marked by
``after_commit``, which fires for released savepoints too) or by rollback. A Core connection has
no after-commit event, so its wakeups are not tracked: workers find that work at their next
poll.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

import asyncpg
from sqlalchemy import Connection, event
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession
from sqlalchemy.orm import Session, SessionTransaction

from cyclone._errors import InvalidInputError, NotInTransactionError
from cyclone._notifier import queue_payload
from cyclone._targets import CallerTransaction, Producer

if TYPE_CHECKING:
    from cyclone._wakeups import Wakeups

__all__ = ["AsyncSession", "async_target", "async_transaction", "sync_parts", "sync_transaction"]

_INFO_KEY = "cyclone.wakeups"
Publish = Callable[[Iterable[str]], None]
"""Sends NOTIFY payloads soon, without waiting (the client's publisher)."""


class SessionWakeups:
    """The wakeups of one session, per open (nested) transaction, until the outermost commit.

    Then they go to ``sink`` (a :class:`Wakeups` from ``track_wakeups``, for the caller to
    publish) or, without one, to ``publish``.
    """

    def __init__(self, session: Session) -> None:
        self.session = session
        self.frames: dict[SessionTransaction, set[str]] = {}
        self.committed: set[SessionTransaction] = set()
        self.publish: Publish | None = None
        self.sink: Wakeups | None = None
        event.listen(session, "after_commit", self._after_commit)
        event.listen(session, "after_transaction_end", self._after_end)

    def _current(self) -> SessionTransaction | None:
        return self.session.get_nested_transaction() or self.session.get_transaction()

    def record(self, queue: str) -> None:
        """``queue`` gets claimable work when the current transaction commits."""
        current = self._current()
        if current is not None:
            self.frames.setdefault(current, set()).add(queue)

    def _after_commit(self, session: Session) -> None:
        # Fires while the committing transaction (a root or a released savepoint) is current.
        current = self._current()
        if current is not None:
            self.committed.add(current)

    def _after_end(self, session: Session, trans: SessionTransaction) -> None:
        queues = self.frames.pop(trans, set())
        if trans not in self.committed:
            return  # rolled back: its wakeups (and its savepoints') are dropped
        self.committed.discard(trans)
        if trans.parent is not None:
            self.frames.setdefault(trans.parent, set()).update(queues)
        elif self.sink is not None:
            for queue in queues:
                self.sink.add(queue)
        elif self.publish is not None and queues:
            self.publish([queue_payload(q) for q in sorted(queues)])


def session_wakeups(session: Session) -> SessionWakeups:
    """The wakeup tracker of ``session`` (made and hooked to its events on first use)."""
    tracker = session.info.get(_INFO_KEY)
    if not isinstance(tracker, SessionWakeups):
        tracker = session.info[_INFO_KEY] = SessionWakeups(session)
    return tracker


def track_session(session: AsyncSession | Session, wakeups: Wakeups) -> Wakeups:
    """Collect the session's committed wakeups into ``wakeups`` (or the :class:`Wakeups`
    already collecting them) instead of publishing them (``cyclone.track_wakeups(session)``)."""
    sync = session.sync_session if isinstance(session, AsyncSession) else session
    tracker = session_wakeups(sync)
    tracker.sink = tracker.sink or wakeups
    return tracker.sink


def _require_driver(dialect: Any, driver: str, what: str, fix: str) -> None:
    if dialect.name != "postgresql" or dialect.driver != driver:
        raise InvalidInputError(
            f"this SQLAlchemy {what} runs on {dialect.name}+{dialect.driver}; {fix}"
        )


_ASYNC_FIX = (
    "cyclone.Client writes through asyncpg: create the engine with a postgresql+asyncpg:// "
    "URL, or use cyclone.sync.Client from synchronous code on postgresql+psycopg://"
)
_SYNC_FIX = (
    "cyclone.sync.Client writes through psycopg 3: create the engine with a "
    "postgresql+psycopg:// URL (psycopg2 is not supported)"
)


async def _asyncpg_of(conn: AsyncConnection) -> asyncpg.Connection:
    raw = (await conn.get_raw_connection()).driver_connection
    assert isinstance(raw, asyncpg.Connection)
    if not raw.is_in_transaction():
        # SQLAlchemy's asyncpg adapter begins the database transaction at its first
        # statement; until then the session's transaction exists only in SQLAlchemy, and a
        # write of ours would commit on its own. One statement through SQLAlchemy begins it.
        await conn.exec_driver_sql("SELECT 1")
    return raw


def async_target(producer: Producer, publish: Publish, tx: object) -> CallerTransaction | None:
    """The caller's transaction of an ``AsyncSession`` or ``AsyncConnection``; None for
    anything else."""
    if isinstance(tx, AsyncSession):
        session = tx
        _require_driver(session.sync_session.get_bind().dialect, "asyncpg", "session", _ASYNC_FIX)
        tracker = session_wakeups(session.sync_session)
        tracker.publish = tracker.publish or publish

        @contextlib.asynccontextmanager
        async def open_session() -> AsyncIterator[asyncpg.Connection]:
            if not session.in_transaction():
                raise NotInTransactionError(NOT_IN_TRANSACTION_SA)
            yield await _asyncpg_of(await session.connection())

        return CallerTransaction(producer, open_session, tracker.record)
    if isinstance(tx, AsyncConnection):
        conn = tx
        _require_driver(conn.dialect, "asyncpg", "connection", _ASYNC_FIX)

        @contextlib.asynccontextmanager
        async def open_connection() -> AsyncIterator[asyncpg.Connection]:
            if not conn.in_transaction():
                raise NotInTransactionError(NOT_IN_TRANSACTION_SA)
            yield await _asyncpg_of(conn)

        return CallerTransaction(producer, open_connection, None)
    return None


NOT_IN_TRANSACTION_SA = (
    "a *_tx call needs a SQLAlchemy session or connection inside a transaction "
    "(async with session.begin(), or after a first statement with autobegin)"
)


def sync_parts(
    tx: object, publish: Publish
) -> tuple[Callable[[], Any], Callable[[str], None] | None] | None:
    """For a sync ``Session`` or ``Connection``: a function giving its psycopg connection
    (checked to be in a transaction) and the wakeup recorder; None for anything else."""
    if isinstance(tx, Session):
        session = tx
        _require_driver(session.get_bind().dialect, "psycopg", "session", _SYNC_FIX)
        tracker = session_wakeups(session)
        tracker.publish = tracker.publish or publish

        def session_conn() -> Any:
            if not session.in_transaction():
                raise NotInTransactionError(NOT_IN_TRANSACTION_SA)
            return session.connection().connection.driver_connection

        return session_conn, tracker.record
    if isinstance(tx, Connection):
        conn = tx
        _require_driver(conn.dialect, "psycopg", "connection", _SYNC_FIX)

        def core_conn() -> Any:
            if not conn.in_transaction():
                raise NotInTransactionError(NOT_IN_TRANSACTION_SA)
            return conn.connection.driver_connection

        return core_conn, None
    return None


@contextlib.asynccontextmanager
async def async_transaction(publish: Publish, session: AsyncSession) -> AsyncIterator[AsyncSession]:
    """``client.transaction(session)``: the session's transaction (a savepoint when one is
    open); its wakeups are published after the outermost commit."""
    _require_driver(session.sync_session.get_bind().dialect, "asyncpg", "session", _ASYNC_FIX)
    tracker = session_wakeups(session.sync_session)
    tracker.publish = tracker.publish or publish
    block = session.begin_nested() if session.in_transaction() else session.begin()
    async with block:
        yield session


@contextlib.contextmanager
def sync_transaction(session: Session, publish: Publish) -> Iterator[Session]:
    """``cyclone.sync.Client.transaction(session)``, as :func:`async_transaction`."""
    _require_driver(session.get_bind().dialect, "psycopg", "session", _SYNC_FIX)
    tracker = session_wakeups(session)
    tracker.publish = tracker.publish or publish
    with session.begin_nested() if session.in_transaction() else session.begin():
        yield session
