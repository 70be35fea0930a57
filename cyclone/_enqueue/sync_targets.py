"""The synchronous client's write targets on psycopg 3: Cyclone's own statement on the
client's source (:class:`SyncOwnStatement`, the twin of ``insert.OwnStatement``) and the
caller's transaction (:func:`caller_target`). Its services are in
``cyclone._services.sync``. Internal, not a stable API.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from typing import Any

import psycopg

from cyclone._enqueue.adapters import adapter_for
from cyclone._enqueue.targets import CallerTransaction, DatabaseTarget, InsertSettings
from cyclone._enqueue.wakeups import SyncTrackedConnection
from cyclone._model.errors import InvalidInputError, NotInTransactionError
from cyclone._services.notifier import queue_payload
from cyclone._services.sync import SyncDatabase, pinned
from cyclone._storage import queries as db
from cyclone._storage.drivers import connect

NOTIFY_FULL = (psycopg.errors.ProgramLimitExceeded,)
NOT_IN_TRANSACTION_PSYCOPG = (
    "a *_tx call needs a psycopg connection inside a transaction (with conn.transaction(), "
    "or after a first statement on a connection that is not in autocommit mode)"
)


class SyncOwnStatement(DatabaseTarget):
    """``tx is None``: Cyclone's own statement on the client's source, committed here."""

    notify_full = NOTIFY_FULL

    def __init__(self, settings: InsertSettings, database: SyncDatabase) -> None:
        super().__init__(settings)
        self.database = database
        self._autocommit = False

    @contextlib.asynccontextmanager
    async def connection(self, *, transaction: bool) -> AsyncIterator[db.Conn]:
        with self.database.connection() as raw:
            self._autocommit = raw.autocommit and not transaction
            if self._autocommit:
                yield connect(raw)
            else:
                with pinned(raw):
                    yield connect(raw)

    def carrying(self, queue: str) -> contextlib.AbstractContextManager[tuple[str, str] | None]:
        # An autocommit statement delivers its own NOTIFY at its commit, as on asyncio.
        wake = (self.database.channel, queue_payload(queue)) if self._autocommit else None
        return contextlib.nullcontext(wake)

    def woke(self, queues: Sequence[str]) -> None:
        self.database.publish([queue_payload(q) for q in sorted(queues)])


def caller_target(
    settings: InsertSettings, publish: Callable[[Iterable[str]], None], tx: Any
) -> CallerTransaction:
    """The caller's transaction ``tx``, whatever holds it."""
    if isinstance(tx, SyncTrackedConnection | psycopg.Connection):
        raw, record = (
            (tx.connection, tx.record) if isinstance(tx, SyncTrackedConnection) else (tx, None)
        )

        def conn() -> psycopg.Connection[Any]:
            if raw.info.transaction_status == psycopg.pq.TransactionStatus.IDLE:
                raise NotInTransactionError(NOT_IN_TRANSACTION_PSYCOPG)
            return raw

        return _caller(settings, conn, record)
    adapter = adapter_for(tx)
    parts = None if adapter is None else adapter.sync_parts(tx, publish)
    if parts is not None:
        return _caller(settings, *parts)
    raise InvalidInputError(
        "tx must be a psycopg connection in a transaction, a SQLAlchemy Session/Connection on "
        f"psycopg, or Django's connection inside atomic(); got {type(tx).__name__}"
    )


def _caller(settings: InsertSettings, get: Any, record: Any) -> CallerTransaction:
    @contextlib.asynccontextmanager
    async def open() -> AsyncIterator[db.Conn]:
        yield connect(get())

    return CallerTransaction(settings, open, record, notify_full=NOTIFY_FULL)
