"""The synchronous client, for producers that are not async: Django views, Flask handlers,
scripts.

``cyclone.sync.Client`` mirrors ``cyclone.Client`` for producing and reading, on psycopg 3. It
runs the same insert path and the same named statements as the asyncio client: the path is
written once as coroutines, which run here on a psycopg connection without an event loop
(``cyclone._storage.drivers``), so no business logic is written twice and no call here starts a loop
(each ``asyncio.run`` of an asyncio client would leave its pool bound to a dead loop). Workers
stay asyncio (``cyclone.Worker``, ``cyclone worker``).
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar, Unpack, overload

import psycopg
import psycopg_pool

from cyclone._enqueue.adapters import adapter_for
from cyclone._enqueue.insert import plan_jobs
from cyclone._enqueue.sync_targets import SyncOwnStatement, caller_target
from cyclone._enqueue.targets import DatabaseTarget, InsertSettings
from cyclone._enqueue.wakeups import SyncTrackedConnection
from cyclone._model.codec import DEFAULT_PAYLOAD_LIMIT
from cyclone._model.errors import InvalidInputError
from cyclone._model.events import Signal
from cyclone._model.handles import RunInfo, RunPage, RunQuery, RunState
from cyclone._model.keyring import Keyring, checked_keyring
from cyclone._model.keys import validate_key
from cyclone._model.options import EnqueueManyOptions, EnqueueOptions, SubmitOptions, validate_int
from cyclone._model.results import ResultWorkflow
from cyclone._model.steps import Kind
from cyclone._model.wakeups import Wakeups
from cyclone._model.workflows import Workflow, defined_workflows
from cyclone._services import transitions
from cyclone._services.layout import Layout
from cyclone._services.notifier import queue_payload
from cyclone._services.observe import Observers
from cyclone._services.runs import page_on, result_of
from cyclone._services.sync import SyncDatabase, SyncRuns
from cyclone._storage.drivers import connect, run_sync
from cyclone._storage.loader import Queries

__all__ = ["Client", "ResultRun", "Run", "track_wakeups"]

In = TypeVar("In")
Out = TypeVar("Out")
Out_co = TypeVar("Out_co", covariant=True)


@dataclass(frozen=True, slots=True)
class Services:
    """The synchronous client's parts, for Cyclone's own modules (internal, not a stable
    API): its connections and wakeups (``database``) and run reads (``runs``)."""

    database: SyncDatabase
    runs: SyncRuns


class Run:
    """A handle on a run for synchronous code: an id and a client, holding no connection.
    ``created``: whether the call that gave it wrote the run (as ``cyclone.Run.created``)."""

    def __init__(self, client: Client, run_id: uuid.UUID, *, created: bool = False) -> None:
        self.client = client
        self.id = run_id
        self.created = created

    def __repr__(self) -> str:
        return f"<cyclone.sync.{type(self).__name__} {self.id}>"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Run) and other.id == self.id

    def __hash__(self) -> int:
        return hash(self.id)

    def status(self) -> RunState:
        """The run's state; :class:`RunNotFoundError` if it is not visible."""
        return self.client.services.runs.status(self.id)

    def wait(self, timeout: float | None = None) -> RunState:
        """Block until the run ends; the builtin :class:`TimeoutError` after ``timeout`` s."""
        state, _ = self.client.services.runs.until_ended(self.id, timeout, result=False)
        return state

    def info(self) -> RunInfo:
        """What the run is and where it stands (as in ``client.list_runs``)."""
        return self.client.services.runs.info(self.id)


class ResultRun(Run, Generic[Out_co]):
    """A run whose ``result()`` is typed: a job's output or a result workflow's."""

    def __init__(
        self, client: Client, run_id: uuid.UUID, output_type: Any, *, created: bool = False
    ) -> None:
        super().__init__(client, run_id, created=created)
        self.output_type = output_type

    def result(self, timeout: float | None = None) -> Out_co:
        """Block until the run ends; its output, or the error it ended with."""
        _, row = self.client.services.runs.until_ended(self.id, timeout, result=True)
        out: Out_co = result_of(self.id, row, self.output_type, self.client.cipher)
        return out


class Client:
    """Cyclone for synchronous code on psycopg 3.

    ``source`` is where Cyclone's own statements go (enqueue without ``_tx``, reads,
    signals, wakeups): a ``psycopg_pool.ConnectionPool``, a ``psycopg.Connection`` (shared
    under a lock), or Django's ``django.db.connection``. ``*_tx`` calls take the caller's
    transaction: a psycopg connection in a transaction (tracked or not), a SQLAlchemy
    ``Session``/``Connection`` on psycopg, or Django's connection inside ``atomic()``.
    """

    def __init__(
        self,
        source: Any,
        *,
        schema: str = "public",
        payload_limit: int = DEFAULT_PAYLOAD_LIMIT,
        cipher: Keyring | None = None,
    ) -> None:
        adapter = None
        if not isinstance(source, psycopg_pool.ConnectionPool | psycopg.Connection):
            adapter = adapter_for(source)
        own = None if adapter is None else adapter.own_connection(source)
        if own is None and not isinstance(source, psycopg_pool.ConnectionPool | psycopg.Connection):
            raise InvalidInputError(
                "cyclone.sync.Client needs a psycopg_pool.ConnectionPool, a psycopg.Connection "
                f"or Django's connection, got {type(source).__name__}"
            )
        self.source = source
        self._queries = Queries(schema)
        self.schema = schema
        self._channel = f"cyclone_{schema}"
        self.payload_limit = validate_int(payload_limit, what="payload_limit", low=1)
        self.cipher = checked_keyring(cipher)
        """The keyring that seals payloads at rest (as ``cyclone.Client``'s), or None."""
        self.observers = Observers()
        self._settings = InsertSettings(
            self._queries, self.payload_limit, self.observers, cipher, layout=Layout(self._queries)
        )
        database = SyncDatabase(source, own, self._queries, self._channel)
        self.services = Services(database=database, runs=SyncRuns(database, cipher))
        """The client's parts, for Cyclone's own modules (internal, not a stable API)."""

    def __repr__(self) -> str:
        return f"<cyclone.sync.Client schema={self.schema!r}>"

    def _target(self, tx: Any) -> DatabaseTarget:
        database = self.services.database
        if tx is None:
            return SyncOwnStatement(self._settings, database)
        return caller_target(self._settings, database.publish, tx)

    # Wakeups

    def publish_wakeups(self, wakeups: Wakeups) -> None:
        """Send one NOTIFY per distinct queue in ``wakeups`` and clear it; call it after the
        commit. It never raises: a failed publish is logged, and polling finds the work."""
        self.services.database.publish([queue_payload(q) for q in sorted(wakeups.take())])

    @overload
    def transaction(
        self, conn: psycopg.Connection[Any]
    ) -> contextlib.AbstractContextManager[SyncTrackedConnection]: ...
    @overload
    def transaction(self, conn: Any) -> contextlib.AbstractContextManager[Any]: ...
    def transaction(self, conn: Any) -> contextlib.AbstractContextManager[Any]:
        """Run a tracked transaction on ``conn`` (a psycopg connection, or a SQLAlchemy
        ``Session`` on psycopg); its wakeups are published after the commit. Inside an open
        transaction the block is a savepoint whose wakeups wait for the outer commit."""
        if not isinstance(conn, psycopg.Connection | SyncTrackedConnection):
            adapter = adapter_for(conn)
            block = (
                None
                if adapter is None
                else adapter.sync_transaction(conn, self.services.database.publish)
            )
            if block is None:
                raise InvalidInputError(
                    "transaction() takes a psycopg connection, a tracked connection or a "
                    f"SQLAlchemy Session on psycopg; got {type(conn).__name__}"
                )
            return block
        return self._tracked(conn)

    @contextlib.contextmanager
    def _tracked(
        self, conn: psycopg.Connection[Any] | SyncTrackedConnection
    ) -> Iterator[SyncTrackedConnection]:
        ttx, wakeups = (
            (conn, conn.wakeups)
            if isinstance(conn, SyncTrackedConnection)
            else (track_wakeups(conn))
        )
        with ttx.transaction():
            yield ttx
        if not ttx.is_in_transaction():
            # Committed: the wakeups go out on the connection in hand, so a caller holding
            # the last connection of a pool does not wait for another one.
            self.services.database.publish(
                [queue_payload(q) for q in sorted(wakeups.take())], ttx.connection
            )
        elif ttx is not conn:
            # Inside an untracked outer transaction, which nothing watches: the wakeups go
            # out now, and the work waits for the workers' next poll.
            self.publish_wakeups(wakeups)

    # Producing

    def enqueue(
        self, kind: Kind[In, Out], input: In, **options: Unpack[EnqueueOptions]
    ) -> ResultRun[Out]:
        """Enqueue one job in Cyclone's own statement (committed when this returns)."""
        return self._enqueue(None, kind, [input], options)[0]

    def enqueue_tx(
        self, tx: Any, kind: Kind[In, Out], input: In, **options: Unpack[EnqueueOptions]
    ) -> ResultRun[Out]:
        """Enqueue one job in the caller's open transaction ``tx``; never commits it."""
        return self._enqueue(tx, kind, [input], options)[0]

    def enqueue_many(
        self, kind: Kind[In, Out], inputs: Sequence[In], **options: Unpack[EnqueueManyOptions]
    ) -> list[ResultRun[Out]]:
        """Enqueue many jobs in one statement; handles in the order of ``inputs``."""
        return self._enqueue(None, kind, list(inputs), options)

    def enqueue_many_tx(
        self,
        tx: Any,
        kind: Kind[In, Out],
        inputs: Sequence[In],
        **options: Unpack[EnqueueManyOptions],
    ) -> list[ResultRun[Out]]:
        """``enqueue_many`` in the caller's open transaction ``tx``."""
        return self._enqueue(tx, kind, list(inputs), options)

    def _enqueue(
        self, tx: Any, kind: Kind[In, Out], inputs: list[In], options: Any
    ) -> list[ResultRun[Out]]:
        target = self._target(tx)
        plan = plan_jobs(self._settings, kind, inputs, options)
        if plan.options.gated:  # a debounce or throttle may name an existing run
            run_id, created = run_sync(target.write_gated_job(plan))
            return [ResultRun(self, run_id, kind.output_type, created=created)]
        if plan.ids:
            run_sync(target.write_jobs(plan))
        return [ResultRun(self, i, kind.output_type, created=True) for i in plan.ids]

    @overload
    def submit(
        self, workflow: ResultWorkflow[In, Out], input: In, **options: Unpack[SubmitOptions]
    ) -> ResultRun[Out]: ...
    @overload
    def submit(
        self, workflow: Workflow[In], input: In, **options: Unpack[SubmitOptions]
    ) -> Run: ...
    def submit(self, workflow: Workflow[In], input: In, **options: Unpack[SubmitOptions]) -> Run:
        """Submit a new workflow run in Cyclone's own statement."""
        return self._submit(None, workflow, None, input, options)[0]

    @overload
    def submit_tx(
        self,
        tx: Any,
        workflow: ResultWorkflow[In, Out],
        input: In,
        **options: Unpack[SubmitOptions],
    ) -> ResultRun[Out]: ...
    @overload
    def submit_tx(
        self, tx: Any, workflow: Workflow[In], input: In, **options: Unpack[SubmitOptions]
    ) -> Run: ...
    def submit_tx(
        self, tx: Any, workflow: Workflow[In], input: In, **options: Unpack[SubmitOptions]
    ) -> Run:
        """Submit a new run in the caller's open transaction ``tx``."""
        return self._submit(tx, workflow, None, input, options)[0]

    @overload
    def submit_once(
        self,
        workflow: ResultWorkflow[In, Out],
        key: str,
        input: In,
        **options: Unpack[SubmitOptions],
    ) -> tuple[ResultRun[Out], bool]: ...
    @overload
    def submit_once(
        self, workflow: Workflow[In], key: str, input: In, **options: Unpack[SubmitOptions]
    ) -> tuple[Run, bool]: ...
    def submit_once(
        self, workflow: Workflow[In], key: str, input: In, **options: Unpack[SubmitOptions]
    ) -> tuple[Run, bool]:
        """The one run of ``key`` (docs/submit-once.md); ``created`` only for the call that
        made it, :class:`SubmitConflictError` for a different input."""
        return self._submit(None, workflow, validate_key(key), input, options)

    @overload
    def submit_once_tx(
        self,
        tx: Any,
        workflow: ResultWorkflow[In, Out],
        key: str,
        input: In,
        **options: Unpack[SubmitOptions],
    ) -> tuple[ResultRun[Out], bool]: ...
    @overload
    def submit_once_tx(
        self,
        tx: Any,
        workflow: Workflow[In],
        key: str,
        input: In,
        **options: Unpack[SubmitOptions],
    ) -> tuple[Run, bool]: ...
    def submit_once_tx(
        self,
        tx: Any,
        workflow: Workflow[In],
        key: str,
        input: In,
        **options: Unpack[SubmitOptions],
    ) -> tuple[Run, bool]:
        """``submit_once`` in the caller's open transaction ``tx``: a second transaction with
        the same key waits for this one to commit or roll back."""
        return self._submit(tx, workflow, validate_key(key), input, options)

    def _submit(
        self, tx: Any, workflow: Workflow[Any], key: str | None, input: Any, options: Any
    ) -> tuple[Run, bool]:
        target = self._target(tx)
        run_id, created = run_sync(
            target.write_run(workflow.plan(self.payload_limit, key, input, options))
        )
        if isinstance(workflow, ResultWorkflow):
            return ResultRun(self, run_id, workflow.output_type, created=created), created
        return Run(self, run_id, created=created), created

    # Reading and signalling

    @overload
    def get_run(self, run_id: uuid.UUID, output_type: None = None) -> Run: ...
    @overload
    def get_run(self, run_id: uuid.UUID, output_type: type[Out]) -> ResultRun[Out]: ...
    def get_run(self, run_id: uuid.UUID, output_type: Any = None) -> Run:
        """A handle on an existing run; :class:`RunNotFoundError` if it is not visible."""
        self.services.runs.status(run_id)
        return Run(self, run_id) if output_type is None else ResultRun(self, run_id, output_type)

    def list_runs(self, query: RunQuery | None = None) -> RunPage:
        """Runs matching ``query``, newest first, one page at a time (as ``cyclone.Client``)."""
        with self.services.database.connection() as raw:
            query = query or RunQuery()
            return run_sync(page_on(connect(raw), self._queries, query, self.cipher))

    def signal(
        self, run_id: uuid.UUID, node: str, payload: Any = None, *, event: str | None = None
    ) -> None:
        """Complete wait node ``node`` of a run with ``payload`` as its output, or deliver
        ``event`` to a node waiting for events (as ``cyclone.Client.signal``)."""
        limit, seal = self.payload_limit, None if self.cipher is None else self.cipher.seal
        sent = Signal.of(defined_workflows(), node, payload, event, limit=limit, seal=seal)
        database = self.services.database
        with database.transaction() as conn:
            effects = run_sync(transitions.signal(conn, self._queries, run_id, sent))
        database.publish(effects.payloads())


def track_wakeups(conn: psycopg.Connection[Any]) -> tuple[SyncTrackedConnection, Wakeups]:
    """Wrap a psycopg connection so that ``*_tx`` calls on it record wakeups; publish them
    with ``client.publish_wakeups(wakeups)`` after the commit."""
    if isinstance(conn, SyncTrackedConnection):
        conn = conn.connection
    wakeups = Wakeups()
    return SyncTrackedConnection(conn, wakeups), wakeups
