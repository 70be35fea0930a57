"""The synchronous client's services on psycopg 3: its connections and wakeups
(:class:`SyncDatabase`, the twin of ``database.py`` and the publisher) and its run reads
(:class:`SyncRuns`, of ``runs.py``). ``cyclone.sync`` is the facade; its write targets are
``cyclone._enqueue.sync_targets``. Internal, not a stable API.

Cyclone's own transactions here run at READ COMMITTED, as on asyncio
(``cyclone._services.database``).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import psycopg
import psycopg_pool

from cyclone._model.errors import RunNotFoundError
from cyclone._model.handles import RunInfo, RunState
from cyclone._model.keyring import Keyring
from cyclone._services.runs import WAIT_POLL_MAX, run_info, timeout_message
from cyclone._storage import queries as db
from cyclone._storage.drivers import connect, run_sync
from cyclone._storage.loader import Queries

logger = logging.getLogger("cyclone")


class SyncDatabase:
    """Where Cyclone's own statements go: a psycopg pool, a psycopg connection (shared under
    a lock) or a library's connection that an adapter opens (``own``: Django's), and the
    wakeups sent there."""

    def __init__(
        self, source: Any, own: Callable[[], Any] | None, queries: Queries, channel: str
    ) -> None:
        self.source = source
        self.own = own
        self.queries = queries
        self.channel = channel
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def connection(self) -> Iterator[psycopg.Connection[Any]]:
        """A connection for Cyclone's own statements, committed when the block ends."""
        if self.own is not None:
            yield self.own()
        elif isinstance(self.source, psycopg_pool.ConnectionPool):
            with self.source.connection() as conn:
                yield conn
        else:
            with self._lock:
                yield self.source

    @contextlib.contextmanager
    def transaction(self) -> Iterator[db.Conn]:
        """A connection inside Cyclone's own transaction."""
        with self.connection() as raw, pinned(raw):
            yield connect(raw)

    def publish(self, payloads: Iterable[str], conn: psycopg.Connection[Any] | None = None) -> None:
        """One NOTIFY statement for ``payloads``, on ``conn`` (idle, just committed) or on the
        client's source; a failure is logged, never raised."""
        payloads = list(payloads)
        if not payloads:
            return
        try:
            if conn is None:
                with self.transaction() as own:
                    run_sync(db.wakeup_notify(own, self.queries, self.channel, payloads))
            else:
                with conn.transaction():
                    run_sync(db.wakeup_notify(connect(conn), self.queries, self.channel, payloads))
        except psycopg.Error as exc:
            logger.warning(
                "publishing %d wakeups failed (%s); polling will pick the work up",
                len(payloads),
                exc,
            )


@contextlib.contextmanager
def pinned(raw: psycopg.Connection[Any]) -> Iterator[None]:
    """``raw.transaction()``; when it begins a transaction (rather than a savepoint), that
    transaction runs at READ COMMITTED whatever the session's default. psycopg sends the
    level with its ``BEGIN``; the connection's own setting is put back after."""
    if raw.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
        with raw.transaction():
            yield
        return
    before = raw.isolation_level
    raw.isolation_level = psycopg.IsolationLevel.READ_COMMITTED
    try:
        with raw.transaction():
            yield
    finally:
        raw.isolation_level = before


class SyncRuns:
    """Run reads for ``cyclone.sync`` handles and the client."""

    def __init__(self, database: SyncDatabase, cipher: Keyring | None = None) -> None:
        self.database = database
        self.cipher = cipher

    def status(self, run_id: uuid.UUID) -> RunState:
        """The run's state; :class:`RunNotFoundError` if it is not visible."""
        with self.database.connection() as raw:
            state = run_sync(db.run_status(connect(raw), self.database.queries, run_id))
        if state is None:
            raise RunNotFoundError(run_id)
        return RunState(state)

    def info(self, run_id: uuid.UUID) -> RunInfo:
        """What the run is and where it stands (as in ``client.list_runs``)."""
        with self.database.connection() as raw:
            row = run_sync(db.run_get(connect(raw), self.database.queries, run_id))
        if row is None:
            raise RunNotFoundError(run_id)
        return run_info(row, cipher=self.cipher)

    def until_ended(
        self, run_id: uuid.UUID, timeout: float | None, *, result: bool
    ) -> tuple[RunState, Any]:
        """Poll the run, with a growing delay up to one second, until it ends; its state and
        (with ``result``) its ``run_result`` row."""
        q = self.database.queries
        deadline = None if timeout is None else time.monotonic() + timeout
        delay = 0.05
        while True:
            with self.database.connection() as raw:
                conn = connect(raw)
                if result:
                    row = run_sync(db.run_result(conn, q, run_id))
                    state: str | None = None if row is None else row["state"]
                else:
                    row = None
                    state = run_sync(db.run_status(conn, q, run_id))
            if state is None:
                raise RunNotFoundError(run_id)
            if RunState(state).terminal:
                return RunState(state), row
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(self._timeout_message(run_id, timeout))
            pause = delay if deadline is None else min(delay, deadline - time.monotonic())
            time.sleep(max(pause, 0.0))
            delay = min(delay * 2, WAIT_POLL_MAX)

    def _timeout_message(self, run_id: uuid.UUID, timeout: float | None) -> str:
        try:
            with self.database.connection() as raw:
                rows = run_sync(db.run_unserved(connect(raw), self.database.queries, run_id))
        except (psycopg.Error, OSError) as exc:
            return timeout_message(run_id, timeout, exc)
        return timeout_message(run_id, timeout, rows)
