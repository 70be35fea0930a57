"""An attempt's completion transaction: the connection a handler's business writes share
with the step's completion, opened when the handler first asks for it."""

from __future__ import annotations

from typing import Any

import asyncpg

from cyclone._enqueue.wakeups import TrackedConnection
from cyclone._model.wakeups import Wakeups
from cyclone._services.database import Database
from cyclone._storage import queries as db


class CompletionTx:
    """The completion transaction of one attempt: opened on first use, written by the worker.

    It belongs to the handler's task: using it from another task, or after the handler
    returned, raises :class:`ContextError`. The worker commits it together with the step's
    completion, or rolls it back with everything in it.
    """

    def __init__(self, database: Database) -> None:
        self._database = database
        self._conn: asyncpg.pool.PoolConnectionProxy | None = None
        self._tx: Any = None
        self.wakeups = Wakeups()
        self.tracked: TrackedConnection | None = None
        self.lost: BaseException | None = None
        """What :meth:`rollback` found: the connection had been lost (the writes with it)."""

    @property
    def opened(self) -> bool:
        """Whether the handler opened it."""
        return self._conn is not None

    async def open(self) -> TrackedConnection:
        """Acquire a pooled connection and begin the transaction (once)."""
        if self.tracked is None:
            conn = await self._database.acquire()
            try:
                tx = self._database.transaction(conn)  # Cyclone's own: at READ COMMITTED
                await tx.start()
                await self._database.layout.mark(conn)  # on Citus: committed in two phases
            except BaseException:
                await self._database.pool.release(conn)
                raise
            self._conn, self._tx = conn, tx
            self.tracked = TrackedConnection(conn, self.wakeups)
        return self.tracked

    @property
    def connection(self) -> asyncpg.pool.PoolConnectionProxy:
        """The open connection (only after :meth:`open`)."""
        assert self._conn is not None
        return self._conn

    async def commit(self) -> None:
        """Commit and give the connection back.

        An error from the commit itself propagates: whether it committed is then unknown (the
        caller asks the record). Once it committed, nothing after can undo that: a connection
        that fails to reset on release is logged and replaced by the pool.
        """
        try:
            await self._tx.commit()
        finally:
            await self._close()

    async def rollback(self) -> None:
        """Roll back (if open) and give the connection back; never raises for a lost
        connection.

        A connection the server ended has been detached from its pool proxy by asyncpg
        already (every call on the proxy then raises ``InterfaceError``), and its transaction
        died with it: there is nothing left to roll back. The error is kept in :attr:`lost`.
        """
        if self._conn is None:
            return
        try:
            await self._tx.rollback()
        except db.DATABASE_ERRORS as exc:  # gone with its connection: nothing to undo
            self.lost = exc
        finally:
            await self._close()

    async def _close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is None:
            return
        # Not waited for: the attempt's slot frees without the pool's reset round trip (a
        # failed reset is logged, and asyncpg closes that connection).
        self._database.release_soon(conn)
