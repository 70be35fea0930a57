"""The client: Cyclone's handle on the application's asyncpg pool and schema.

A facade: it checks its settings, builds the services it is made of (``cyclone._services.bundle``:
the database, the publisher, the notifier, the runs service) and gives each public method to
the service that does it. Cyclone's other modules are handed those services explicitly.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import functools
import logging
import uuid
from collections.abc import AsyncIterator, Callable, Iterable
from typing import TYPE_CHECKING, Any, TypeVar, overload

import asyncpg

from cyclone._enqueue.adapters import adapter_for
from cyclone._enqueue.insert import Inserter, Parts
from cyclone._enqueue.targets import InsertSettings
from cyclone._enqueue.wakeups import TrackedConnection, tracked_transaction
from cyclone._model.batches import HandlerBatchContext
from cyclone._model.codec import DEFAULT_PAYLOAD_LIMIT
from cyclone._model.context import HandlerContext
from cyclone._model.errors import InvalidInputError
from cyclone._model.events import Signal
from cyclone._model.explain import Explanation
from cyclone._model.handles import ResultRun, Run, RunPage, RunQuery, RunState
from cyclone._model.keyring import Keyring, checked_keyring
from cyclone._model.options import seconds, validate_int
from cyclone._model.retention import PURGE_BATCH, Retention, check_retention
from cyclone._model.stats import QueueStats, Throughput, WorkerInfo
from cyclone._model.wakeups import Wakeups
from cyclone._model.workflows import defined_workflows
from cyclone._services import migrator, stats
from cyclone._services.bundle import Services
from cyclone._services.database import Database
from cyclone._services.explain import explain
from cyclone._services.forks import Forks, run_id_of
from cyclone._services.keys import Keys
from cyclone._services.notifier import Notifier
from cyclone._services.observe import Observer, Observers
from cyclone._services.publisher import Publisher
from cyclone._services.queues import Queues
from cyclone._services.resource import AsyncResource
from cyclone._services.runs import Runs, search_args
from cyclone._services.schedules import Schedules
from cyclone._services.streams import Streams
from cyclone._storage import queries as db
from cyclone._storage.loader import Queries

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncSession

    from cyclone._model.nodes import Node

logger = logging.getLogger("cyclone")


_T = TypeVar("_T")


class Client(AsyncResource):
    """Cyclone's entry point: one per application, sharing the application's asyncpg pool.

    ``notify`` turns LISTEN on or off for this process (workers and ``run.wait``); it does not
    affect ``publish_wakeups``. ``notify_coalesce`` (seconds) gathers wakeups published within
    that window into one NOTIFY per queue. ``payload_limit`` and ``output_limit`` cap encoded
    inputs and outputs in bytes. ``retention`` (a :class:`Retention`) makes every worker of this
    client delete terminal runs once they are old enough, for every name without a retention of
    its own (a step's or workflow's ``retention=``). ``listen_dsn`` is where the LISTEN
    connection goes (default: the pool's own connect arguments): a DSN straight to PostgreSQL
    when the pool goes through PgBouncer in transaction mode, which cannot keep a LISTEN.
    ``cipher`` (a :class:`Keyring`) seals inputs, outputs, signal payloads and error messages
    at rest and opens them on read (docs/encryption.md).
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
        cipher: Keyring | None = None,
    ) -> None:
        if not isinstance(pool, asyncpg.Pool):
            raise InvalidInputError(f"Client needs an asyncpg.Pool, got {type(pool).__name__}")
        self.pool = pool
        self._queries = Queries(schema)
        self.schema = schema
        self._channel = f"cyclone_{schema}"
        self.notify = bool(notify)
        self.notify_coalesce = seconds(notify_coalesce, what="notify_coalesce")
        self.retention = check_retention(retention, what="retention")
        self.payload_limit = validate_int(payload_limit, what="payload_limit", low=1)
        self.output_limit = validate_int(output_limit, what="output_limit", low=1)
        if listen_dsn is not None and (not isinstance(listen_dsn, str) or not self.notify):
            raise InvalidInputError("listen_dsn must be a DSN (str), and needs notify=True")
        self.listen_dsn = listen_dsn
        self.cipher = checked_keyring(cipher)
        self.observers = Observers()
        database = Database(pool, self._queries, listens=self.notify and listen_dsn is None)
        notifier = Notifier(pool, self._channel, listen_dsn=listen_dsn) if self.notify else None
        publisher = Publisher(
            database, self._channel, coalesce=self.notify_coalesce, notifier=notifier
        )
        runs = Runs(database, publisher, notifier, cipher)
        streams = Streams(database, publisher, notifier, cipher)
        settings = InsertSettings(
            self._queries, self.payload_limit, self.observers, cipher, layout=database.layout
        )
        self.services = Services(
            database=database,
            publisher=publisher,
            notifier=notifier,
            runs=runs,
            streams=streams,
            observers=self.observers,
            inserter=Inserter(Parts(settings, database, publisher, owner=self)),
            new_context=functools.partial(Context, self, streams=streams),
            new_batch_context=functools.partial(BatchContext, self),
        )
        """The parts this client is made of, as Cyclone's own workers, handles and
        definitions use them (not a stable API: use the client's methods)."""

    def __repr__(self) -> str:
        return f"<cyclone.Client schema={self.schema!r}>"

    def observe(self, observer: Observer) -> None:
        """Report enqueues, claims, outcomes and spans of this client and its workers to
        ``observer`` (for example ``cyclone.prometheus.PrometheusMetrics``)."""
        if not isinstance(observer, Observer):
            raise InvalidInputError(f"{observer!r} is not a cyclone.Observer")
        self.observers.members.append(observer)

    async def _end(self, failed: bool) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Send the wakeups still held by the coalescing window. Call it before closing the pool."""
        await self.services.publisher.aclose()
        await self.services.database.aclose()

    async def migrate(self) -> list[int]:
        """Create or update Cyclone's tables; safe to call from many processes at once, and
        while workers run (docs/operations.md, "Migrations").

        Returns the migration versions this call applied (empty when up to date).
        """
        return await migrator.migrate(self.services.database)

    async def check_schema(self) -> None:
        """Raise :class:`SchemaNotMigratedError` if the schema lacks migrations this package
        ships, :class:`SchemaVersionError` if it has some this package does not know, and
        :class:`UnsupportedPoolerError` if the pool goes through a pooler in transaction mode
        with asyncpg's statement cache on (docs/operations.md, PgBouncer), and
        :class:`UnsupportedLayoutError` for a layout on Citus that Cyclone cannot run on
        (docs/scaling.md)."""
        await self.services.database.check_schema()

    async def pending_migrations(self) -> list[int]:
        """The versions of the migrations this package ships that the schema lacks, oldest
        first (empty when it is up to date): what ``cyclone migrate --check`` lists, for a
        deploy pipeline or an admin page. :class:`SchemaVersionError` if the schema has
        migrations this package does not know (upgrade cyclone-pg on this host)."""
        return await self.services.database.pending_migrations()

    async def wait_until_ready(self, *, wait_for_schema: bool = False) -> None:
        """Wait until the database answers (each reason to wait logged once), then check the
        schema and the pool's route to PostgreSQL, as a worker does before it starts: for a
        deploy step or a readiness probe. With ``wait_for_schema``, also wait while the schema
        lacks migrations (another process is applying them); without, raise
        :class:`SchemaNotMigratedError`. Cancel the call to stop waiting."""
        await self.services.database.wait_until_ready(wait_for_schema=wait_for_schema)

    @property
    def queues(self) -> Queues:
        """Flow control: pause and resume queues, and set the concurrency and rate limits
        every worker's claim obeys (docs/flow-control.md)."""
        return Queues(self.services.database, self.services.publisher)

    @property
    def keys(self) -> Keys:
        """The keys of sealed payloads: values per key id, rotation (docs/encryption.md)."""
        return Keys(self.services.database, self.cipher)

    @property
    def schedules(self) -> Schedules:
        """The schedules stored in this schema: list, pause, resume, trigger now, and create,
        update or delete dynamic ones (docs/schedules.md)."""
        return Schedules(self.services.database, self.services.publisher, self.cipher)

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
        a transaction is open), its wakeups published after the session's outermost commit,
        even inside a transaction that ``track_wakeups(session)`` tracks (the innermost
        tracker gets each wakeup).
        """
        if not isinstance(
            conn, asyncpg.Connection | asyncpg.pool.PoolConnectionProxy | TrackedConnection
        ):
            adapter = adapter_for(conn)
            if adapter is not None:
                block = adapter.async_transaction(self.services.publisher.publish, conn)
                if block is not None:
                    return block
        return tracked_transaction(self.services.publisher, conn)

    async def publish_wakeups(self, wakeups: Wakeups) -> None:
        """Send one NOTIFY per distinct queue in ``wakeups`` and clear it.

        Call it after the commit. Without a coalescing window it returns once the NOTIFY is
        sent, unless every connection of the pool is in use: then the caller may be holding
        one of them, so the NOTIFY goes out in the background as soon as one is free. With a
        window, the NOTIFY goes out when the window closes. It never raises: a failed publish
        is logged, and polling picks the work up within one poll interval.
        """
        await self.services.publisher.publish_wakeups(wakeups)

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
        await self.services.runs.status(run_id)
        return Run(self, run_id) if output_type is None else ResultRun(self, run_id, output_type)

    async def list_runs(self, query: RunQuery | None = None) -> RunPage:
        """Runs matching ``query``, newest first, one page at a time."""
        return await self.services.runs.page(query or RunQuery())

    async def purge_terminal_runs(
        self,
        older_than: dt.timedelta | float,
        *,
        states: Iterable[RunState] = (
            RunState.COMPLETED,
            RunState.FAILED,
            RunState.CANCELLED,
            RunState.EXPIRED,
        ),
        on_batch: Callable[[int], None] | None = None,
    ) -> int:
        """Delete runs that ended more than ``older_than`` ago; return how many.

        Deletes in batches, each its own short transaction, and calls ``on_batch`` with the
        count of each (for a progress bar). A purged run's submit key is free.
        """
        age = dt.timedelta(seconds=seconds(older_than, what="older_than"))
        wanted = [RunState(s) for s in states]
        if on_batch is not None and not callable(on_batch):
            raise InvalidInputError(f"on_batch must be a callable taking a count, not {on_batch!r}")
        return await self.services.runs.purge(
            [(s, age) for s in wanted], PURGE_BATCH, batches=None, on_batch=on_batch
        )

    async def stats(self) -> list[QueueStats]:
        """Live work per queue, for dashboards and ``cyclone stats``."""
        return await stats.queues(self.services.database)

    async def workers(self) -> list[WorkerInfo]:
        """The live workers of this schema, newest first (``cyclone stats`` counts them per
        queue; the dashboard lists them)."""
        return await stats.workers(self.services.database)

    async def explain(self, run: Run | uuid.UUID) -> Explanation:
        """Why ``run`` (a handle or a run id) is not running: one :class:`Reason` per node
        that is not done, each with a :class:`ReasonCode`, a sentence saying what goes on and
        what to do, and the facts behind it (docs/troubleshooting.md, "Why is my run not
        running?"). A run that has ended gets one reason saying how it ended.

        Read-only, by key (the run, its nodes and tasks, their queues' flow control and the
        live workers), so it is cheap enough to call in a loop. :class:`RunNotFoundError` if
        the run is not visible.
        """
        return await explain(self.services.database, run_id_of(run, call="explain"), self.cipher)

    async def fork(
        self, run: Run | uuid.UUID, *, from_node: str, input: Any = None, key: str | None = None
    ) -> Run:
        """A new run of an ended workflow run's graph that runs ``from_node`` and every node
        after it again, on the current code, and copies the other nodes with their outputs
        (docs/workflows.md, "Forking a run"). ``input`` replaces the run's input (None keeps
        it); ``key`` makes one fork per key, as ``submit_once`` (``created`` tells). A result
        workflow's fork is a :class:`ResultRun`; ``run.info().forked_from`` links it back.
        """
        forks = Forks(
            self.services.database, self.services.publisher, self.cipher, self.payload_limit
        )
        return await forks.fork(self, run, from_node, input, key)

    async def signal(
        self, run_id: uuid.UUID, node: str, payload: Any = None, *, event: str | None = None
    ) -> None:
        """Complete wait node ``node`` of a run with ``payload`` as its output, or (``event``)
        deliver that event to a node that waits for any or all of several events.

        A signal for a node not yet reachable is kept and applied when it is reached. When
        this process defined the run's workflow, a payload that is not of the node's
        declared type, or an event it does not declare, raises :class:`InvalidInputError`
        before anything is written; elsewhere the payload is stored unchecked.
        """
        limit, seal = self.payload_limit, None if self.cipher is None else self.cipher.seal
        sent = Signal.of(defined_workflows(), node, payload, event, limit=limit, seal=seal)
        await self.services.runs.signal(run_id, sent)

    # Read models for dashboards (cyclone.web)

    async def count_runs(self, query: RunQuery | None = None, *, at_most: int = 10_000) -> int:
        """How many runs match ``query``'s filters (its limit aside), counting at most
        ``at_most``: a result equal to ``at_most`` means "that many or more". ``query.scan``
        bounds the runs read, as in :meth:`list_runs`."""
        query = query or RunQuery()
        cap = validate_int(at_most, what="at_most", low=1)
        filters = search_args(query)
        async with self.services.database.acquire() as conn:
            return await db.run_count(conn, self._queries, filters, cap=cap, scan=query.scan)

    async def throughput(self, *, minutes: int = 60) -> list[Throughput]:
        """Jobs and workflow nodes that ended per queue and minute over the last ``minutes``
        (the current minute included): completed, and failed with their attempts used up.
        Minutes in which a queue finished nothing are left out; sorted by queue, then minute."""
        return await stats.throughput(self.services.database, minutes)

    @contextlib.asynccontextmanager
    async def watch(self) -> AsyncIterator[asyncio.Event]:
        """An event set whenever Cyclone's notifications say something changed: new work on
        a queue, a run that ended, or the listener reconnecting (notifications may have been
        missed). Clear it once you have looked; for live views, such as the dashboard's.

        Notifications are hints: a view should also refresh now and then, and with
        ``notify=False`` the event is never set.
        """
        event = asyncio.Event()
        notifier = self.services.notifier
        if notifier is None:
            yield event
            return
        notifier.acquire()
        unsubscribe = notifier.subscribe_all(lambda _payload: event.set())
        try:
            yield event
        finally:
            unsubscribe()
            await asyncio.shield(notifier.release())


class Context(HandlerContext[Client]):
    """What a handler knows about its attempt, passed as its first argument.

    ``run_id``, ``node`` (None for a standalone job), ``kind``, ``attempt`` (1 for the first),
    ``max_attempts``, ``queue`` and ``client`` (the worker's client).
    """

    @overload
    async def output(self, node: Node[_T]) -> _T: ...
    @overload
    async def output(self, node: str) -> Any: ...
    async def output(self, node: Node[Any] | str) -> Any:
        """The decoded output of dependency ``node``: a node handle (``Node[Out]`` gives an
        ``Out``) or its name (untyped)."""
        return await super().output(node)


class BatchContext(HandlerBatchContext[Client]):
    """What a batch handler knows about its call, passed as its first argument.

    ``kind``, ``queue``, ``group`` (the ``group_by`` key of its items, None without one),
    ``attempts`` (each item's attempt, in the order of the inputs: ``run_id``, ``attempt``,
    ``max_attempts``), ``client`` (the worker's client), and ``completion_tx()``.
    """
