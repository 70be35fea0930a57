"""The database service: the one way Cyclone gets a connection and opens its own transaction.

Cyclone's own transactions run at READ COMMITTED, whatever the session's default
(``default_transaction_isolation``): their lock-then-read statements (lock a run, then read
its nodes; lock a task, then complete it) rely on each statement seeing what committed
before it, including what a lock they waited for protected. Under REPEATABLE READ or
SERIALIZABLE the second read would see the snapshot of the first statement, and a row
updated by the lock's holder would raise a serialization failure instead of being read.
A caller's transaction is the caller's: Cyclone only inserts in it (docs/transactions.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any

import asyncpg

from cyclone._model.errors import InvalidStateError, SchemaNotMigratedError
from cyclone._services import pooler as _pooler
from cyclone._services import readiness
from cyclone._services.layout import Layout
from cyclone._storage.loader import Queries

logger = logging.getLogger("cyclone")

ISOLATION = "read_committed"
"""The isolation level of every transaction Cyclone opens for itself."""

PooledConnection = asyncpg.pool.PoolConnectionProxy

HOLD = 1.0
"""Seconds a :class:`Held` connection is kept at most, from when it was taken from the pool."""


class Database:
    """The application's asyncpg pool and Cyclone's queries for one schema.

    ``acquire`` and ``borrow`` give connections; ``transaction`` opens Cyclone's own
    transaction on one, at :data:`ISOLATION`. ``listens``: this process LISTENs through the
    pool (``notify`` without a ``listen_dsn``), which the pooler check takes into account.
    """

    def __init__(self, pool: asyncpg.Pool, queries: Queries, *, listens: bool) -> None:
        self.pool = pool
        self.queries = queries
        self.listens = listens  # this process LISTENs through the pool
        self.layout = Layout(queries)  # learnt by the start-up checks or the first *_tx call
        self._spare: PooledConnection | None = None
        self._releases: set[asyncio.Task[None]] = set()

    def acquire(self) -> Any:
        """``pool.acquire()``, refused for a closed pool or from another event loop."""
        if self.pool.is_closing():
            raise InvalidStateError("the client's asyncpg pool is closed")
        self.check_loop()
        return self.pool.acquire()

    def check_loop(self) -> None:
        """An asyncpg pool works only in the event loop it was made in; another loop (a second
        ``asyncio.run``) gets this error rather than asyncpg's "another operation is in
        progress" or a hang."""
        loop = getattr(self.pool, "_loop", None)  # asyncpg keeps the pool's loop here
        if loop is not None and loop is not asyncio.get_running_loop():
            raise InvalidStateError(
                "this client's asyncpg pool belongs to another event loop (one per "
                "asyncio.run): create the pool and the client inside the loop that uses "
                "them, or use cyclone.sync.Client from synchronous code"
            )

    @staticmethod
    def transaction(conn: Any) -> Any:
        """Cyclone's own transaction on ``conn`` (not in one yet), at READ COMMITTED."""
        return conn.transaction(isolation=ISOLATION)

    @contextlib.asynccontextmanager
    async def transact(self) -> AsyncIterator[PooledConnection]:
        """A pooled connection inside Cyclone's own transaction, committed when the block ends."""
        async with self.acquire() as conn, self.transaction(conn):
            yield conn

    def has_room(self) -> bool:
        """Whether a connection can be had without waiting for a holder to give one back."""
        pool = self.pool
        return pool.get_idle_size() > 0 or pool.get_size() < pool.get_max_size()

    @contextlib.asynccontextmanager
    async def borrow(self) -> AsyncIterator[PooledConnection]:
        """A pooled connection for Cyclone's own statements, given back without the caller
        waiting for the pool's reset (a round trip).

        Only for statements that leave no session state behind (no SET, LISTEN, cursor or
        session lock), so a connection left clean is kept until the event loop's next turn:
        calls in a row, as a loop of enqueues makes them, share it with no reset between.
        """
        self.check_loop()
        conn, self._spare = self._spare, None
        if conn is not None and not _reusable(conn):
            self.release_soon(conn)  # the pool takes a closed connection back too
            conn = None
        if conn is None:
            conn = await self.acquire()
        clean = False
        try:
            yield conn
            clean = _reusable(conn)
        finally:
            if clean and self._spare is None:
                self._spare = conn
                asyncio.get_running_loop().call_soon(self._release_spare, conn)
            else:
                self.release_soon(conn)

    async def aclose(self) -> None:
        """Give back the kept connection and wait for the releases in flight."""
        self._release_spare()
        if self._releases:
            await asyncio.wait(self._releases)

    def _release_spare(self, conn: PooledConnection | None = None) -> None:
        """Give the kept connection back (only ``conn``, if given: it may be in use again)."""
        if self._spare is not None and (conn is None or self._spare is conn):
            conn, self._spare = self._spare, None
            self.release_soon(conn)

    def release_soon(self, conn: PooledConnection) -> None:
        """Give ``conn`` back to the pool without waiting for its reset round trip; the
        release is awaited by :meth:`aclose`."""
        # A task of its own, so the caller's cancellation cannot stop it (asyncpg's release
        # is shielded too, and closes a connection it cannot reset).
        task = asyncio.get_running_loop().create_task(
            self.pool.release(conn), name="cyclone-release"
        )
        self._releases.add(task)
        task.add_done_callback(self._released)

    def _released(self, task: asyncio.Task[None]) -> None:
        self._releases.discard(task)
        if not task.cancelled() and (exc := task.exception()) is not None:
            logger.warning(
                "giving a connection back to the pool failed (%s); asyncpg closed it",
                exc,
            )

    async def check_schema(self) -> None:
        """What ``Client.check_schema`` checks: the migrations, then the pool's route."""
        async with self.acquire() as conn:
            await readiness.check(conn, self.queries)
            await self.layout.learn(conn)
        await _pooler.check(self.pool, self.queries, listens=False)

    async def pending_migrations(self) -> list[int]:
        """The migrations this package ships that the schema lacks (the pool's route is not
        checked: applying migrations does not need it)."""
        async with self.acquire() as conn:
            try:
                await readiness.check(conn, self.queries)
            except SchemaNotMigratedError as exc:
                return exc.missing
        return []

    async def wait_until_ready(self, *, wait_for_schema: bool) -> None:
        """Wait until the database answers (and, with ``wait_for_schema``, is migrated), then
        check the pool's route to it: what a worker does before it starts."""
        if self.pool.is_closing():
            raise InvalidStateError("the client's asyncpg pool is closed")
        await readiness.wait_until_ready(
            self.pool, self.queries, wait_for_schema=wait_for_schema, listens=self.listens
        )
        async with self.acquire() as conn:
            await self.layout.learn(conn)


class Held:
    """Pool connections that one loop of Cyclone's own statements (a producer's claims, the
    completer's batches, the publisher's background NOTIFYs) keeps between its uses, so that
    uses in a row pay no pool release and no reset round trip, up to ``keep`` of them at once.

    The same rule as :meth:`Database.borrow`: only for statements that leave no session state
    behind. A use takes a kept connection or, when none is kept, one from the pool. At its end
    the connection goes back to the pool instead of being kept when the use raised (a
    connection that died or was left in doubt under a statement is never used again: the
    next use takes a fresh one), when it is closed or in a transaction, when the pool has no
    other connection to spare (someone else may be waiting for one), or when it was taken
    ``hold`` seconds ago or more. A kept connection unused for that long goes back at once,
    so the pool's own limits (``max_queries``, expiry) apply and an idle loop does not sit on
    it. :meth:`release` gives back what is kept, when the loop stops.
    """

    def __init__(self, database: Database, keep: int = 1, hold: float = HOLD) -> None:
        self._database = database
        self._keep = keep
        self._hold = hold
        self._kept: list[PooledConnection] = []
        # When each connection taken goes back at the latest, and the timer that sees to it.
        self._until: dict[PooledConnection, tuple[float, asyncio.TimerHandle]] = {}
        self._released = False

    @contextlib.asynccontextmanager
    async def use(self) -> AsyncIterator[PooledConnection]:
        """A connection for this loop's statements: a kept one, or one from the pool."""
        loop = asyncio.get_running_loop()
        conn = None
        while self._kept and conn is None:
            conn = self._kept.pop()
            if not _reusable(conn):
                self._give_back(conn)
                conn = None
        if conn is None:
            conn = await self._database.acquire()
            until = loop.time() + self._hold
            self._until[conn] = until, loop.call_at(until, self._expire, conn)
        keep = False
        try:
            yield conn
            keep = (
                not self._released
                and len(self._kept) < self._keep
                and loop.time() < self._until[conn][0]
                and _reusable(conn)
                and self._database.has_room()
            )
        finally:
            if keep:
                self._kept.append(conn)
            else:
                self._give_back(conn)

    def release(self) -> None:
        """Give back the kept connections (the loop stopped); later uses keep none."""
        self._released = True
        self.give_back()

    def give_back(self) -> None:
        """Give back the kept connections now; later uses may keep theirs again."""
        while self._kept:
            self._give_back(self._kept.pop())

    def _expire(self, conn: PooledConnection) -> None:
        """``conn`` was taken ``hold`` seconds ago: give it back if it is not in use."""
        if conn in self._kept:
            self._kept.remove(conn)
            self._give_back(conn)

    def _give_back(self, conn: PooledConnection) -> None:
        _, timer = self._until.pop(conn, (0.0, None))
        if timer is not None:
            timer.cancel()
        self._database.release_soon(conn)


def _reusable(conn: PooledConnection) -> bool:
    """Whether ``conn`` can serve the next borrow: open and outside a transaction. A
    connection the server ended is detached from its proxy, whose every call then raises
    ``InterfaceError``: not reusable either."""
    try:
        return not conn.is_closed() and not conn.is_in_transaction()
    except asyncpg.InterfaceError:
        return False
