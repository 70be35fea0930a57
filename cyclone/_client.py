"""The client: Cyclone's handle on the application's asyncpg pool and schema."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
import sys
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Any, TypeVar, overload

import asyncpg

from cyclone import _codec, _pooler, _schema, _transitions
from cyclone import _queries as db
from cyclone._codec import DEFAULT_PAYLOAD_LIMIT
from cyclone._errors import (
    InvalidInputError,
    InvalidStateError,
    NoOutputError,
    ReadOnlyServerError,
    RunCancelledError,
    RunFailedError,
    RunNotFoundError,
)
from cyclone._flow import Queues, flow_fields
from cyclone._keys import validate_key, validate_name
from cyclone._notifier import Notifier, queue_payload
from cyclone._observe import Observer, Observers
from cyclone._options import seconds, validate_int
from cyclone._run import (
    NodeInfo,
    NodePayloads,
    QueueStats,
    ResultRun,
    Run,
    RunInfo,
    RunPage,
    RunPayloads,
    RunQuery,
    RunState,
    Throughput,
    UnservedWork,
    WorkerInfo,
)
from cyclone._scheduler import Schedules
from cyclone._sql import Queries
from cyclone._wakeups import TrackedConnection, Wakeups, track_wakeups

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncSession

logger = logging.getLogger("cyclone")


@dataclass(frozen=True, slots=True)
class Retention:
    """How long terminal runs are kept before the workers' sweeper deletes them.

    ``None`` keeps runs in that state forever. A run's submit key stays taken while the
    run is kept, so keep runs longer than a caller may retry a request. ``batch`` caps the
    rows deleted per statement, so each sweep holds its locks only briefly.
    """

    completed: dt.timedelta | None = None
    failed: dt.timedelta | None = None
    cancelled: dt.timedelta | None = None
    batch: int = 1000

    def __post_init__(self) -> None:
        for name in ("completed", "failed", "cancelled"):
            value = getattr(self, name)
            if value is not None and (
                not isinstance(value, dt.timedelta) or value < dt.timedelta(0)
            ):
                raise InvalidInputError(f"Retention.{name} must be a non-negative timedelta")
        validate_int(self.batch, what="Retention.batch", low=1)

    def ages(self) -> list[tuple[RunState, dt.timedelta]]:
        """Each state with a retention, and its age."""
        return [
            (state, age)
            for state, age in (
                (RunState.COMPLETED, self.completed),
                (RunState.FAILED, self.failed),
                (RunState.CANCELLED, self.cancelled),
            )
            if age is not None
        ]


_WAIT_POLL_MAX = 1.0  # run.wait() polls at least this often, whatever notifications do
_DIAGNOSE_TIMEOUT = 2.0  # seconds a timed-out wait spends finding what holds the run up
_PURGE_BATCH = 1000
_MIGRATE_TRIES = 5
_THROUGHPUT_MAX_MINUTES = 24 * 60
_T = TypeVar("_T")


class Client:
    """Cyclone's entry point: one per application, sharing the application's asyncpg pool.

    ``notify`` turns LISTEN on or off for this process (workers and ``run.wait``); it does not
    affect ``publish_wakeups``. ``notify_coalesce`` (seconds) gathers wakeups published within
    that window into one NOTIFY per queue. ``payload_limit`` and ``output_limit`` cap encoded
    inputs and outputs in bytes. ``retention`` (a :class:`Retention`) makes every worker of this
    client delete terminal runs once they are old enough. ``listen_dsn`` is where the LISTEN
    connection goes (default: the pool's own connect arguments): a DSN straight to PostgreSQL
    when the pool goes through PgBouncer in transaction mode, which cannot keep a LISTEN.
    """

    def __init__(
        self,
        pool: asyncpg.Pool,
        *,
        schema: str = "public",
        notify: bool = True,
        notify_coalesce: float = 0.0,
        retention: Retention | None = None,
        payload_limit: int = DEFAULT_PAYLOAD_LIMIT,
        output_limit: int = DEFAULT_PAYLOAD_LIMIT,
        listen_dsn: str | None = None,
    ) -> None:
        if not isinstance(pool, asyncpg.Pool):
            raise InvalidInputError(f"Client needs an asyncpg.Pool, got {type(pool).__name__}")
        self.pool = pool
        self.queries = Queries(schema)
        self.schema = schema
        self.channel = f"cyclone_{schema}"
        self.notify = bool(notify)
        self.notify_coalesce = seconds(notify_coalesce, what="notify_coalesce")
        if retention is not None and not isinstance(retention, Retention):
            raise InvalidInputError("retention must be a cyclone.Retention")
        self.retention = retention
        self.payload_limit = validate_int(payload_limit, what="payload_limit", low=1)
        self.output_limit = validate_int(output_limit, what="output_limit", low=1)
        if listen_dsn is not None and (not isinstance(listen_dsn, str) or not self.notify):
            raise InvalidInputError("listen_dsn must be a DSN (str), and needs notify=True")
        self.listen_dsn = listen_dsn
        self._notifier = Notifier(pool, self.channel, listen_dsn=listen_dsn)
        self.observers = Observers()
        self._pending: set[str] = set()
        self._flush_task: asyncio.Task[None] | None = None
        self._closing = asyncio.Event()
        self._releases: set[asyncio.Task[None]] = set()
        self._spare: asyncpg.pool.PoolConnectionProxy | None = None
        self._notifying = 0  # inserts in flight that carry their own NOTIFY (see _insert)

    def __repr__(self) -> str:
        return f"<cyclone.Client schema={self.schema!r}>"

    def observe(self, observer: Observer) -> None:
        """Report enqueues, claims, outcomes and spans of this client and its workers to
        ``observer`` (for example ``cyclone.prometheus.PrometheusMetrics``)."""
        if not isinstance(observer, Observer):
            raise InvalidInputError(f"{observer!r} is not a cyclone.Observer")
        self.observers.members.append(observer)

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Send the wakeups still held by the coalescing window. Call it before closing the pool."""
        self._closing.set()
        if self._flush_task is not None:
            await asyncio.shield(self._flush_task)
        while self._pending:
            await self._flush()
        self._release_spare()
        if self._releases:
            await asyncio.wait(self._releases)

    def _acquire(self) -> Any:
        if self.pool.is_closing():
            raise InvalidStateError("the client's asyncpg pool is closed")
        self._check_loop()
        return self.pool.acquire()

    def _check_loop(self) -> None:
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

    @contextlib.asynccontextmanager
    async def _borrow(self) -> AsyncIterator[asyncpg.pool.PoolConnectionProxy]:
        """A pooled connection for Cyclone's own statements, given back without the caller
        waiting for the pool's reset (a round trip).

        Only for statements that leave no session state behind (no SET, LISTEN, cursor or
        session lock), so a connection left clean is kept until the event loop's next turn:
        calls in a row, as a loop of enqueues makes them, share it with no reset between.
        """
        self._check_loop()
        conn, self._spare = self._spare, None
        if conn is not None and conn.is_closed():
            self._release_soon(conn)  # the pool takes a closed connection back too
            conn = None
        if conn is None:
            conn = await self._acquire()
        clean = False
        try:
            yield conn
            clean = not conn.is_in_transaction()
        finally:
            if clean and self._spare is None:
                self._spare = conn
                asyncio.get_running_loop().call_soon(self._release_spare, conn)
            else:
                self._release_soon(conn)

    def _release_spare(self, conn: asyncpg.pool.PoolConnectionProxy | None = None) -> None:
        """Give the kept connection back (only ``conn``, if given: it may be in use again)."""
        if self._spare is not None and (conn is None or self._spare is conn):
            conn, self._spare = self._spare, None
            self._release_soon(conn)

    def _release_soon(self, conn: asyncpg.pool.PoolConnectionProxy) -> None:
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

    async def migrate(self) -> list[int]:
        """Create or update Cyclone's tables; safe to call from many processes at once.

        Returns the migration versions this call applied (empty when up to date).
        """
        for attempt in range(1, _MIGRATE_TRIES + 1):
            try:
                async with self._acquire() as conn, conn.transaction():
                    applied = await db.migrations_apply(conn, self.queries)
                break
            except asyncpg.ReadOnlySQLTransactionError as exc:
                raise ReadOnlyServerError(self.schema) from exc
            except asyncpg.DeadlockDetectedError:
                # A migration that locks tables can meet running workers locking rows in
                # another order; PostgreSQL aborts one side, and both sides try again.
                if attempt == _MIGRATE_TRIES:
                    raise
                logger.warning(
                    "migrating schema %s met a deadlock with running workers; trying again "
                    "(%d of %d)",
                    self.schema,
                    attempt + 1,
                    _MIGRATE_TRIES,
                    extra={"schema": self.schema},
                )
                await asyncio.sleep(0.05 * attempt)
        if applied:
            logger.info(
                "applied migrations %s to schema %s",
                applied,
                self.schema,
                extra={"schema": self.schema},
            )
        return applied

    async def check_schema(self) -> None:
        """Raise :class:`SchemaNotMigratedError` if the schema lacks migrations this package
        ships, :class:`SchemaVersionError` if it has some this package does not know, and
        :class:`UnsupportedPoolerError` if the pool goes through a pooler in transaction mode
        with asyncpg's statement cache on (docs/operations.md, PgBouncer)."""
        async with self._acquire() as conn:
            await _schema.check(conn, self.queries)
        await _pooler.check(self.pool, self.queries, listens=False)

    async def _wait_until_ready(self, *, wait_for_schema: bool) -> None:
        """Wait until the database answers (and, with ``wait_for_schema``, is migrated), then
        check the pool's route to it: what a worker does before it starts."""
        if self.pool.is_closing():
            raise InvalidStateError("the client's asyncpg pool is closed")
        listens = self.notify and self.listen_dsn is None
        await _schema.wait_until_ready(
            self.pool, self.queries, wait_for_schema=wait_for_schema, listens=listens
        )

    @property
    def queues(self) -> Queues:
        """Flow control: pause and resume queues, and set the concurrency and rate limits
        every worker's claim obeys (docs/flow-control.md)."""
        return Queues(self)

    @property
    def schedules(self) -> Schedules:
        """The schedules stored in this schema: list, pause, resume, trigger now, and create,
        update or delete dynamic ones (docs/schedules.md)."""
        return Schedules(self)

    # Wakeups

    @overload
    def transaction(
        self, conn: AsyncSession
    ) -> contextlib.AbstractAsyncContextManager[AsyncSession]: ...
    @overload
    def transaction(
        self, conn: asyncpg.Connection | asyncpg.pool.PoolConnectionProxy | TrackedConnection
    ) -> contextlib.AbstractAsyncContextManager[TrackedConnection]: ...
    def transaction(self, conn: Any) -> contextlib.AbstractAsyncContextManager[Any]:
        """Run a tracked transaction on ``conn``; its wakeups are published after commit.

        A SQLAlchemy ``AsyncSession`` (on asyncpg) gets ``session.begin()`` (a savepoint when
        a transaction is open), its wakeups published after the session's outermost commit.
        """
        if "sqlalchemy" in sys.modules:
            from cyclone.integrations import sqlalchemy as glue

            if isinstance(conn, glue.AsyncSession):
                return glue.async_transaction(self, conn)
        return self._tracked_transaction(conn)

    @contextlib.asynccontextmanager
    async def _tracked_transaction(
        self, conn: asyncpg.Connection | asyncpg.pool.PoolConnectionProxy | TrackedConnection
    ) -> AsyncIterator[TrackedConnection]:
        """Run a tracked transaction on ``conn``; its wakeups are published after commit.

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
                await self.publish_wakeups(wakeups)
        elif self.notify_coalesce <= 0:
            await self._send(sorted(queue_payload(q) for q in wakeups.take()), ttx.connection)
        else:
            await self.publish_wakeups(wakeups)

    async def publish_wakeups(self, wakeups: Wakeups) -> None:
        """Send one NOTIFY per distinct queue in ``wakeups`` and clear it.

        Call it after the commit. Without a coalescing window it returns once the NOTIFY is
        sent, unless every connection of the pool is in use: then the caller may be holding
        one of them, so the NOTIFY goes out in the background as soon as one is free. With a
        window, the NOTIFY goes out when the window closes. It never raises: a failed publish
        is logged, and polling picks the work up within one poll interval.
        """
        queues = wakeups.take()
        if not queues:
            return
        payloads = [queue_payload(q) for q in queues]
        if self.notify_coalesce > 0 or not self._pool_has_room():
            self._publish(payloads)
            return
        if self._flush_task is None or self._flush_task.done():
            # Nothing in flight: send it from here, without a task hop.
            self._pending.update(payloads)
            await self._flush()
            return
        self._publish(payloads)
        await asyncio.shield(self._flush_task)

    def _pool_has_room(self) -> bool:
        """Whether a connection can be had without waiting for a holder to give one back."""
        pool = self.pool
        return pool.get_idle_size() > 0 or pool.get_size() < pool.get_max_size()

    def _publish(self, payloads: Iterable[str]) -> None:
        """Send ``payloads`` soon, without waiting: at most one NOTIFY statement is in flight,
        and payloads that arrive meanwhile go out together in the next one."""
        self._pending.update(payloads)
        if self._pending and (self._flush_task is None or self._flush_task.done()):
            self._flush_task = asyncio.get_running_loop().create_task(
                self._flush_soon(), name="cyclone-publish"
            )

    async def _flush_soon(self) -> None:
        if self.notify_coalesce > 0:
            with contextlib.suppress(TimeoutError):  # the window closes, or the client does
                await asyncio.wait_for(self._closing.wait(), self.notify_coalesce)
        while self._pending:
            await self._flush()

    async def _flush(self) -> None:
        payloads, self._pending = sorted(self._pending), set()
        await self._send(payloads)

    async def _send(self, payloads: list[str], conn: db.Conn | None = None) -> None:
        """One NOTIFY statement for ``payloads``, on ``conn`` or on a pooled connection.

        A failure is logged, never raised: polling picks the work up.
        """
        if not payloads:
            return
        try:
            if conn is None:
                async with self._borrow() as pooled:
                    await db.wakeup_notify(pooled, self.queries, self.channel, payloads)
            else:
                await db.wakeup_notify(conn, self.queries, self.channel, payloads)
        except (*db.DATABASE_ERRORS, InvalidStateError) as exc:
            logger.warning(
                "publishing %d wakeups failed (%s); polling will pick the work up",
                len(payloads),
                exc,
            )

    # Runs

    @overload
    async def get_run(self, run_id: uuid.UUID, output_type: None = None) -> Run: ...
    @overload
    async def get_run(self, run_id: uuid.UUID, output_type: type[_T]) -> ResultRun[_T]: ...
    @overload
    async def get_run(self, run_id: uuid.UUID, output_type: Any) -> ResultRun[Any]: ...
    async def get_run(self, run_id: uuid.UUID, output_type: Any = None) -> Run:
        """A handle on an existing run; :class:`RunNotFoundError` if it is not visible.

        With ``output_type`` it is a :class:`ResultRun` whose ``result()`` decodes to it.
        """
        await self._run_status(run_id)
        return Run(self, run_id) if output_type is None else ResultRun(self, run_id, output_type)

    async def list_runs(self, query: RunQuery | None = None) -> RunPage:
        """Runs matching ``query``, newest first, one page at a time."""
        query = query or RunQuery()
        limit = validate_int(query.limit, what="limit", low=1)
        args = search_args(query)
        async with self._acquire() as conn:
            rows = await db.run_search(conn, self.queries, *args, limit=limit + 1, scan=query.scan)
            runs = [run_info(r) for r in rows[:limit]]
            if len(rows) > limit:
                next_cursor: str | None = str(runs[-1].id)
            elif query.scan is not None:
                # A short page from a bounded walk: go on from where the walk ended, if the
                # history goes on.
                end = await db.run_walk_end(conn, self.queries, args[4], query.scan)
                next_cursor = None if end is None else str(end)
            else:
                next_cursor = None
        return RunPage(runs=runs, next_cursor=next_cursor)

    async def purge_terminal_runs(
        self,
        older_than: dt.timedelta | float,
        *,
        states: Iterable[RunState] = (RunState.COMPLETED, RunState.FAILED, RunState.CANCELLED),
    ) -> int:
        """Delete runs that ended more than ``older_than`` ago; return how many.

        Deletes in batches, each its own short transaction. A purged run's submit key is free.
        """
        age = dt.timedelta(seconds=seconds(older_than, what="older_than"))
        wanted = [RunState(s) for s in states]
        return await self._purge([(s, age) for s in wanted], _PURGE_BATCH, batches=None)

    async def _purge(
        self,
        ages: list[tuple[RunState, dt.timedelta]],
        batch: int,
        *,
        batches: int | None,
        on_batch: Callable[[int], None] | None = None,
    ) -> int:
        """Purge in batches of ``batch``, each its own transaction; stop after ``batches``
        per state. The cutoff is fixed at the start, so a busy system cannot keep it going."""
        now = dt.datetime.now(dt.UTC)
        total = 0
        for state, age in ages:
            done = 0
            while batches is None or done < batches:
                async with self._acquire() as conn:
                    count = await db.run_purge(conn, self.queries, now - age, [state.value], batch)
                total += count
                done += 1
                if on_batch is not None:
                    on_batch(count)
                if count < batch:
                    break
        return total

    async def stats(self) -> list[QueueStats]:
        """Live work per queue, for dashboards and ``cyclone stats``."""
        async with self._acquire() as conn:
            rows = await db.stats_queues(conn, self.queries)
            unserved = await db.stats_unserved(conn, self.queries)
            flow = {r["queue"]: r for r in await db.queue_list(conn, self.queries, None)}
        work: dict[str, list[UnservedWork]] = {}
        for u in unserved:
            work.setdefault(u["queue"], []).append(
                UnservedWork(kind=u["kind"], workflow=u["workflow"], count=u["count"])
            )
        stats = [
            QueueStats(
                **dict(r),
                unserved=sum(w.count for w in work.get(r["queue"], ())),
                unserved_work=work.get(r["queue"], []),
                **flow_fields(flow.pop(r["queue"], None)),
            )
            for r in rows
        ]
        # Paused or limited queues without work or workers show too (flow control).
        idle = [QueueStats(q, 0, 0, 0, 0, 0, None, 0, **flow_fields(f)) for q, f in flow.items()]
        return sorted(stats + idle, key=lambda s: s.queue)

    async def workers(self) -> list[WorkerInfo]:
        """The live workers of this schema, newest first (``cyclone stats`` counts them per
        queue; the dashboard lists them)."""
        async with self._acquire() as conn:
            rows = await db.worker_list(conn, self.queries)
        return [WorkerInfo(**dict(r)) for r in rows]

    async def signal(self, run_id: uuid.UUID, node: str, payload: Any = None) -> None:
        """Complete wait node ``node`` of a run with ``payload`` as its output.

        A signal for a node not yet reachable is kept and applied when it is reached.
        """
        validate_name(node, what="node")
        encoded = _codec.encode(payload, Any, what="signal payload", limit=self.payload_limit)
        async with self._acquire() as conn, conn.transaction():
            effects = await _transitions.signal(conn, self.queries, run_id, node, encoded)
        self._publish(effects.payloads())

    async def _run_status(self, run_id: uuid.UUID) -> RunState:
        async with self._acquire() as conn:
            state = await db.run_status(conn, self.queries, run_id)
        if state is None:
            raise RunNotFoundError(run_id)
        return RunState(state)

    async def _run_wait(self, run_id: uuid.UUID, timeout: float | None) -> RunState:
        state, _ = await self._until_ended(run_id, timeout, self._read_state)
        return state

    async def _read_state(self, run_id: uuid.UUID) -> tuple[RunState, None]:
        return await self._run_status(run_id), None

    async def _read_result(self, run_id: uuid.UUID) -> tuple[RunState, db.Record]:
        async with self._acquire() as conn:
            row = await db.run_result(conn, self.queries, run_id)
        if row is None:
            raise RunNotFoundError(run_id)
        return RunState(row["state"]), row

    async def _until_ended(
        self,
        run_id: uuid.UUID,
        timeout: float | None,
        read: Callable[[uuid.UUID], Awaitable[tuple[RunState, _T]]],
    ) -> tuple[RunState, _T]:
        """``read`` the run until its state is terminal; woken by the run's end notification,
        polled with a growing delay (at most ``_WAIT_POLL_MAX``) as the floor.

        When ``timeout`` passes, the builtin :class:`TimeoutError` says which run, and what
        holds it up if no live worker serves some of its claimable work.
        """
        deadline = asyncio.timeout(timeout)
        try:
            async with deadline:
                return await self._poll_until_ended(run_id, read)
        except TimeoutError:
            if not deadline.expired():
                raise  # from the read itself, not our deadline
            raise TimeoutError(await self._timeout_message(run_id, timeout)) from None

    async def _timeout_message(self, run_id: uuid.UUID, timeout: float | None) -> str:
        message = f"run {run_id} did not end within {timeout:g} s"
        try:
            async with asyncio.timeout(_DIAGNOSE_TIMEOUT), self._acquire() as conn:
                rows = await db.run_unserved(conn, self.queries, run_id)
        except (*db.DATABASE_ERRORS, InvalidStateError, TimeoutError) as exc:
            return f"{message} (what holds it up is unknown: {exc!r})"
        blocked = [
            (f"node {r['node']!r} ({r['kind']})" if r["node"] else f"job {r['kind']!r}")
            + f" on queue {r['queue']!r}"
            for r in rows
        ]
        if len(blocked) == 1:
            message += f": {blocked[0]} is available and no live worker serves it"
        elif blocked:
            message += f": {', '.join(blocked)} are available and no live worker serves them"
        return message

    async def _poll_until_ended(
        self, run_id: uuid.UUID, read: Callable[[uuid.UUID], Awaitable[tuple[RunState, _T]]]
    ) -> tuple[RunState, _T]:
        event = None
        if self.notify:
            self._notifier.acquire()
            event = self._notifier.watch_run(run_id)
        try:
            delay = 0.05
            while True:
                state, found = await read(run_id)
                if state.terminal:
                    return state, found
                if event is None:
                    await asyncio.sleep(delay)
                else:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(event.wait(), delay)
                    event.clear()
                delay = min(delay * 2, _WAIT_POLL_MAX)
        finally:
            if event is not None:
                self._notifier.unwatch_run(run_id, event)
                await asyncio.shield(self._notifier.release())

    async def _run_info(self, run_id: uuid.UUID) -> RunInfo:
        async with self._acquire() as conn:
            rows = await db.run_list(
                conn, self.queries, run_id, None, None, None, None, None, None, limit=1
            )
            if not rows:
                raise RunNotFoundError(run_id)
            nodes = await db.run_nodes(conn, self.queries, run_id)
            edges = await db.run_edges(conn, self.queries, run_id)
            payload = await db.run_payload(conn, self.queries, run_id)
        info = run_info(rows[0], payload)
        info.edges.extend((e["parent"], e["child"]) for e in edges)
        info.nodes.extend(
            NodeInfo(
                name=n["node"],
                kind=n["kind"],
                state=n["state"],
                attempts=n["attempts"],
                errors=_codec.decode(n["errors"], list[dict[str, Any]]),
            )
            for n in nodes
        )
        return info

    async def _run_cancel(self, run_id: uuid.UUID) -> bool:
        async with self._acquire() as conn, conn.transaction():
            cancelled, effects = await _transitions.cancel(conn, self.queries, run_id)
        self._publish(effects.payloads())
        return cancelled

    async def _run_retry(self, run_id: uuid.UUID, node: str | None) -> None:
        async with self._acquire() as conn, conn.transaction():
            effects = await _transitions.retry(conn, self.queries, run_id, node)
        self._publish(effects.payloads())

    async def _run_result(self, run_id: uuid.UUID, output_type: Any, timeout: float | None) -> Any:
        # The read that sees the run ended is the one that returns its output.
        _, row = await self._until_ended(run_id, timeout, self._read_result)
        return result_of(run_id, row, output_type)

    # Read models for dashboards (cyclone.web)

    async def count_runs(self, query: RunQuery | None = None, *, at_most: int = 10_000) -> int:
        """How many runs match ``query``'s filters (its limit aside), counting at most
        ``at_most``: a result equal to ``at_most`` means "that many or more". ``query.scan``
        bounds the runs read, as in :meth:`list_runs`."""
        query = query or RunQuery()
        cap = validate_int(at_most, what="at_most", low=1)
        args = search_args(query)
        async with self._acquire() as conn:
            return await db.run_count(conn, self.queries, *args, cap=cap, scan=query.scan)

    async def throughput(self, *, minutes: int = 60) -> list[Throughput]:
        """Steps that ended per queue and minute over the last ``minutes`` (the current minute
        included): completed, and failed with their attempts used up. Minutes in which a
        queue finished nothing are left out; sorted by queue, then minute."""
        window = validate_int(minutes, what="minutes", low=1)
        if window > _THROUGHPUT_MAX_MINUTES:
            raise InvalidInputError(
                f"minutes must be at most {_THROUGHPUT_MAX_MINUTES} (one day), got {window}"
            )
        async with self._acquire() as conn:
            rows = await db.throughput_minutes(conn, self.queries, window)
        return [Throughput(**dict(r)) for r in rows]

    @contextlib.asynccontextmanager
    async def watch(self) -> AsyncIterator[asyncio.Event]:
        """An event set whenever Cyclone's notifications say something changed: new work on
        a queue, a run that ended, or the listener reconnecting (notifications may have been
        missed). Clear it once you have looked; for live views, such as the dashboard's.

        Notifications are hints: a view should also refresh now and then, and with
        ``notify=False`` the event is never set.
        """
        event = asyncio.Event()
        if not self.notify:
            yield event
            return
        self._notifier.acquire()
        unsubscribe = self._notifier.subscribe_all(lambda _payload: event.set())
        try:
            yield event
        finally:
            unsubscribe()
            await asyncio.shield(self._notifier.release())

    async def _run_payloads(self, run_id: uuid.UUID) -> RunPayloads:
        async with self._acquire() as conn:
            row = await db.run_payloads(conn, self.queries, run_id)
            if row is None:
                raise RunNotFoundError(run_id)
            nodes = await db.node_payloads(conn, self.queries, run_id)
        return RunPayloads(
            input=_codec.decode(row["input"], Any),
            output=None if row["output"] is None else _codec.decode(row["output"], Any),
            nodes={
                n["node"]: NodePayloads(
                    queue=n["queue"],
                    output=None if n["output"] is None else _codec.decode(n["output"], Any),
                    signal=None if n["signal"] is None else _codec.decode(n["signal"], Any),
                    signalled=n["signal"] is not None,
                )
                for n in nodes
            },
        )


def result_of(run_id: uuid.UUID, row: db.Record, output_type: Any) -> Any:
    """The typed result of an ended run's ``run_result`` row, or the error it ended with."""
    if row["state"] == "failed":
        raise RunFailedError(run_id, _codec.decode(row["error"], Any) if row["error"] else None)
    if row["state"] == "cancelled":
        raise RunCancelledError(run_id)
    if not row["job"] and row["result_node"] is None:
        raise NoOutputError(run_id)
    return _codec.decode(row["output"], output_type)


def search_args(query: RunQuery) -> list[Any]:
    """The filter parameters of run_search and run_count ($1..$7), checked."""
    states = query.state
    if isinstance(states, RunState | str):
        states = [states]
    if query.scan is not None:
        validate_int(query.scan, what="scan", low=1)
    cursor = None
    if query.cursor is not None:
        try:
            cursor = uuid.UUID(query.cursor)
        except ValueError:
            raise InvalidInputError(f"not a cursor from list_runs: {query.cursor!r}") from None
    return [
        None if query.name is None else validate_name(query.name, what="name"),
        None if query.key is None else validate_key(query.key),
        query.created_after,
        query.created_before,
        cursor,
        None if states is None else [RunState(s).value for s in states],
        query.queue,
    ]


def run_info(row: db.Record, payload: db.Record | None = None) -> RunInfo:
    input = output = None
    if payload is not None:
        input = _codec.decode(payload["input"], Any)
        output = None if payload["output"] is None else _codec.decode(payload["output"], Any)
    return RunInfo(
        id=row["id"],
        name=row["name"],
        key=row["key"],
        state=RunState(row["state"]),
        created_at=row["created_at"],
        finished_at=row["finished_at"],
        error=_codec.decode(row["error"], dict[str, Any]) if row["error"] else None,
        job=row["job"],
        input=input,
        output=output,
    )
