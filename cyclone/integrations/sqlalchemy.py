"""SQLAlchemy sessions and connections as the caller's transaction.

Cyclone writes through the driver connection of the session's current transaction (asyncpg for
``AsyncSession``/``AsyncConnection``, psycopg for ``Session``/``Connection``) and never begins,
commits or rolls back. A session's wakeups are kept per (nested) transaction with the session's
own events: a savepoint that rolls back (``begin_nested``) drops its wakeups, one that is
released hands them to its parent, and the outermost commit delivers them. ``after_commit``
fires once the driver's commit returned, so a wakeup never goes out before the work is
visible; ``after_transaction_end`` then tells whether the block ended by commit (marked by
``after_commit``, which fires for released savepoints too) or by rollback. A Core connection has
no after-commit event, so its wakeups are not tracked: workers find that work at their next
poll.

Each wakeup is delivered to the innermost tracker open when it was recorded: the
:class:`~cyclone.Wakeups` of a ``track_wakeups(session)`` (for its transaction only), the
client of a ``client.transaction(session)`` block (for that block only), or else the client
that wrote it. A tracker never outlives its block, so a session reused for later blocks (or
requests) publishes their wakeups as those blocks say.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable, Iterator
from typing import TYPE_CHECKING, Any, TypeAlias

import asyncpg
from sqlalchemy import Connection, event
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession
from sqlalchemy.orm import Session, SessionTransaction

from cyclone._enqueue.adapters import Adapter, Publish, SyncParts
from cyclone._enqueue.targets import CallerTransaction, InsertSettings
from cyclone._model.errors import InvalidInputError, NotInTransactionError
from cyclone._services.notifier import queue_payload

if TYPE_CHECKING:
    from cyclone._model.wakeups import Wakeups

__all__ = ["AsyncSession", "async_target", "async_transaction", "sync_parts", "sync_transaction"]

_INFO_KEY = "cyclone.wakeups"
Destination: TypeAlias = "Wakeups | Publish"
"""Where a committed transaction's wakeups go: a caller's :class:`Wakeups`, or a client's
publisher."""


class _Scope:
    """A tracker open on a session: where its wakeups go, and the transaction it covers
    (None until the session begins the transaction a ``track_wakeups`` made outside one
    covers)."""

    __slots__ = ("destination", "transaction")

    def __init__(self, destination: Destination, transaction: SessionTransaction | None) -> None:
        self.destination = destination
        self.transaction = transaction


class SessionWakeups:
    """The wakeups of one session, per open (nested) transaction and per destination, until
    the outermost commit delivers them."""

    def __init__(self, session: Session) -> None:
        self.session = session
        self.frames: dict[SessionTransaction, dict[Destination, set[str]]] = {}
        self.committed: set[SessionTransaction] = set()
        self.scopes: list[_Scope] = []  # the open trackers, innermost last
        event.listen(session, "after_transaction_create", self._after_create)
        event.listen(session, "after_commit", self._after_commit)
        event.listen(session, "after_transaction_end", self._after_end)

    def _current(self) -> SessionTransaction | None:
        return self.session.get_nested_transaction() or self.session.get_transaction()

    def track(self, wakeups: Wakeups) -> None:
        """``track_wakeups(session)``: the current (innermost) transaction's wakeups from here
        on go to ``wakeups``; outside a transaction, those of the next one the session begins."""
        self.scopes.append(_Scope(wakeups, self._current()))

    @contextlib.contextmanager
    def block(self, publish: Publish) -> Iterator[None]:
        """``client.transaction(session)``: inside this block (opened as its transaction
        began), wakeups go to the block's client."""
        scope = _Scope(publish, self._current())
        self.scopes.append(scope)
        try:
            yield
        finally:
            # Already gone if the block's transaction ended inside it (a commit in the block).
            if scope in self.scopes:
                self.scopes.remove(scope)

    def record(self, queue: str, writer: Publish) -> None:
        """``queue`` gets claimable work when the current transaction commits; it goes to the
        innermost open tracker, else to ``writer`` (the client that wrote the work)."""
        current = self._current()
        if current is not None:
            destination = self.scopes[-1].destination if self.scopes else writer
            self.frames.setdefault(current, {}).setdefault(destination, set()).add(queue)

    def _after_create(self, session: Session, trans: SessionTransaction) -> None:
        if trans.parent is None:  # a root: the transaction that pending trackers cover
            for scope in self.scopes:
                if scope.transaction is None:
                    scope.transaction = trans

    def _after_commit(self, session: Session) -> None:
        # Fires while the committing transaction (a root or a released savepoint) is current.
        current = self._current()
        if current is not None:
            self.committed.add(current)

    def _after_end(self, session: Session, trans: SessionTransaction) -> None:
        # The trackers that covered this transaction end with it, whichever way it ended.
        self.scopes = [s for s in self.scopes if s.transaction is not trans]
        frame = self.frames.pop(trans, {})
        if trans not in self.committed:
            return  # rolled back: its wakeups (and its savepoints') are dropped
        self.committed.discard(trans)
        if trans.parent is not None:
            parent = self.frames.setdefault(trans.parent, {})
            for destination, queues in frame.items():
                parent.setdefault(destination, set()).update(queues)
            return
        for destination, queues in frame.items():
            if callable(destination):
                destination([queue_payload(q) for q in sorted(queues)])
            else:
                for queue in queues:
                    destination.add(queue)


def session_wakeups(session: Session) -> SessionWakeups:
    """The wakeup tracker of ``session`` (made and hooked to its events on first use)."""
    tracker = session.info.get(_INFO_KEY)
    if not isinstance(tracker, SessionWakeups):
        tracker = session.info[_INFO_KEY] = SessionWakeups(session)
    return tracker


def track_session(session: AsyncSession | Session, wakeups: Wakeups) -> Wakeups:
    """Collect the committed wakeups of the session's current transaction (or, outside one,
    of the next it begins) into ``wakeups`` instead of publishing them
    (``cyclone.track_wakeups(session)``)."""
    sync = session.sync_session if isinstance(session, AsyncSession) else session
    session_wakeups(sync).track(wakeups)
    return wakeups


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


def async_target(
    settings: InsertSettings, publish: Publish, tx: object
) -> CallerTransaction | None:
    """The caller's transaction of an ``AsyncSession`` or ``AsyncConnection``; None for
    anything else."""
    if isinstance(tx, AsyncSession):
        session = tx
        _require_driver(session.sync_session.get_bind().dialect, "asyncpg", "session", _ASYNC_FIX)
        tracker = session_wakeups(session.sync_session)

        @contextlib.asynccontextmanager
        async def open_session() -> AsyncIterator[asyncpg.Connection]:
            if not session.in_transaction():
                raise NotInTransactionError(NOT_IN_TRANSACTION_SA)
            yield await _asyncpg_of(await session.connection())

        return CallerTransaction(settings, open_session, lambda q: tracker.record(q, publish))
    if isinstance(tx, AsyncConnection):
        conn = tx
        _require_driver(conn.dialect, "asyncpg", "connection", _ASYNC_FIX)

        @contextlib.asynccontextmanager
        async def open_connection() -> AsyncIterator[asyncpg.Connection]:
            if not conn.in_transaction():
                raise NotInTransactionError(NOT_IN_TRANSACTION_SA)
            yield await _asyncpg_of(conn)

        return CallerTransaction(settings, open_connection, None)
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

        def session_conn() -> Any:
            if not session.in_transaction():
                raise NotInTransactionError(NOT_IN_TRANSACTION_SA)
            return session.connection().connection.driver_connection

        return session_conn, lambda q: tracker.record(q, publish)
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
    open); the wakeups of the block are the client's to publish, after the outermost commit,
    whatever tracker an enclosing block has."""
    _require_driver(session.sync_session.get_bind().dialect, "asyncpg", "session", _ASYNC_FIX)
    tracker = session_wakeups(session.sync_session)
    block = session.begin_nested() if session.in_transaction() else session.begin()
    async with block:
        with tracker.block(publish):
            yield session


@contextlib.contextmanager
def sync_transaction(session: Session, publish: Publish) -> Iterator[Session]:
    """``cyclone.sync.Client.transaction(session)``, as :func:`async_transaction`."""
    _require_driver(session.get_bind().dialect, "psycopg", "session", _SYNC_FIX)
    tracker = session_wakeups(session)
    block = session.begin_nested() if session.in_transaction() else session.begin()
    with block, tracker.block(publish):
        yield session


class _SQLAlchemy(Adapter):
    """Sessions and connections of SQLAlchemy, on asyncpg (async) or psycopg (sync)."""

    def async_target(
        self, settings: InsertSettings, publish: Publish, tx: object
    ) -> CallerTransaction | None:
        return async_target(settings, publish, tx)

    def async_transaction(
        self, publish: Publish, tx: object
    ) -> contextlib.AbstractAsyncContextManager[Any] | None:
        return async_transaction(publish, tx) if isinstance(tx, AsyncSession) else None

    def track(self, tx: object, wakeups: Wakeups) -> bool:
        if not isinstance(tx, AsyncSession | Session):
            return False
        track_session(tx, wakeups)
        return True

    def sync_parts(self, tx: object, publish: Publish) -> SyncParts | None:
        return sync_parts(tx, publish)

    def sync_transaction(
        self, tx: object, publish: Publish
    ) -> contextlib.AbstractContextManager[Any] | None:
        return sync_transaction(tx, publish) if isinstance(tx, Session) else None


ADAPTER = _SQLAlchemy()
"""The ``cyclone.adapters`` entry point for ``sqlalchemy``."""
