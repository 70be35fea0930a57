"""The one insert path behind every enqueue and submit variant, on either driver.

A call is checked and turned into a plan (:class:`JobPlan`, or the workflow's
:class:`~cyclone._model.plans.SubmitPlan`) before the first statement, so bad input writes
nothing. A :class:`Target` then writes the plan: where the connection comes from and what
happens to the wakeup are the target's, the statements and their retry rules are
:class:`DatabaseTarget`'s, written once:

The targets live in ``cyclone._enqueue.targets``:

- :class:`OwnStatement`: ``tx is None``; Cyclone takes a pooled connection, writes (one
  autocommit statement, or a short transaction for a sequence lock) and publishes the wakeup.
- :class:`CallerTransaction`: the caller's open transaction (a raw asyncpg connection, a
  tracked one, a completion transaction, a SQLAlchemy session); never begins, commits or rolls
  it back, and hands the wakeup to the transaction's tracker, if it has one, for after commit.
- the synchronous client's targets (``cyclone.sync``) run the same coroutines on psycopg.
- a ``tx`` whose type has an ``insert_target()`` provides its own target: the test kit's
  ``TxRecorder`` records plans instead of writing them.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import asyncpg

from cyclone._enqueue.adapters import adapter_for
from cyclone._enqueue.targets import (
    NOT_IN_TRANSACTION,
    CallerTransaction,
    DatabaseTarget,
    InsertSettings,
    JobPlan,
    Target,
)
from cyclone._enqueue.wakeups import TrackedConnection
from cyclone._model.codec import DEFAULT_PAYLOAD_LIMIT, encode_array
from cyclone._model.errors import ContextError, InvalidInputError, NotInTransactionError
from cyclone._model.handles import ResultRun, Run, RunsClient, RunService
from cyclone._model.ids import uuid7_many
from cyclone._model.options import EnqueueOptions, check_options
from cyclone._model.results import ResultWorkflow
from cyclone._model.streams import StreamReader
from cyclone._model.workflows import Workflow
from cyclone._services.database import Database
from cyclone._services.publisher import Publisher
from cyclone._storage import queries as db

if TYPE_CHECKING:
    from cyclone._model.steps import Kind

# The option names a call takes at run time are the keys its TypedDict gives a type checker.
ENQUEUE_OPTIONS = EnqueueOptions.__optional_keys__


class OwnStatement(DatabaseTarget):
    """``tx is None`` on the asyncio client: a pooled connection, committed here."""

    def __init__(self, settings: InsertSettings, database: Database, publisher: Publisher) -> None:
        super().__init__(settings)
        self.database = database
        self.publisher = publisher

    @contextlib.asynccontextmanager
    async def connection(self, *, transaction: bool) -> AsyncIterator[db.Conn]:
        # The connection's reset on release is not waited for (Database.borrow).
        async with self.database.borrow() as pooled:
            if transaction:
                async with self.database.transaction(pooled):
                    yield pooled
            else:
                yield pooled

    def carrying(self, queue: str) -> contextlib.AbstractContextManager[tuple[str, str] | None]:
        # An insert that commits on its own wakes workers itself (Publisher.carrying).
        return self.publisher.carrying(queue)

    def woke(self, queues: Sequence[str]) -> None:
        self.publisher.wake(queues)


def asyncpg_caller(
    settings: InsertSettings, conn: db.Conn, record: Callable[[str], None] | None
) -> CallerTransaction:
    """The caller's transaction on a raw asyncpg connection."""

    @contextlib.asynccontextmanager
    async def open() -> AsyncIterator[db.Conn]:
        if not conn.is_in_transaction():
            raise NotInTransactionError(NOT_IN_TRANSACTION)
        yield conn

    return CallerTransaction(settings, open, record)


def payload_limit(settings: InsertSettings | None) -> int:
    """The client's input limit; a recorder in a unit test may come without a client."""
    return DEFAULT_PAYLOAD_LIMIT if settings is None else settings.payload_limit


def plan_jobs(
    settings: InsertSettings | None,
    kind: Kind[Any, Any],
    inputs: Sequence[Any],
    options: Mapping[str, Any],
) -> JobPlan:
    """Check options and inputs; the plan of what to insert (nothing is written yet)."""
    opts = check_options(options, ENQUEUE_OPTIONS, call="enqueue")
    if opts.unique is not None and len(inputs) != 1:
        raise InvalidInputError("unique= applies to a single enqueue, not to enqueue_many")
    if opts.gated and len(inputs) != 1:
        raise InvalidInputError(
            "debounce= and throttle= apply to a single enqueue, not to enqueue_many: each "
            "call's key decides whether it makes a run; enqueue the jobs one by one"
        )
    encoded = encode_array(
        inputs, kind.input_type, what=f"input of step {kind.name!r}", limit=payload_limit(settings)
    )
    if settings is not None and settings.cipher is not None:
        encoded = settings.cipher.seal_each(encoded)
    return JobPlan(
        kind=kind,
        inputs=inputs,
        encoded=encoded,
        ids=uuid7_many(len(inputs)),
        options=opts,
        queue=opts.queue or kind.queue,
    )


@dataclass(frozen=True, slots=True)
class Parts:
    """What a client's insert path writes with: its settings, its database and publisher
    (for Cyclone's own statements and their wakeups), and the owner of the handles it gives
    (the client, whose runs service they keep)."""

    settings: InsertSettings
    database: Database
    publisher: Publisher
    owner: RunsClient


class Inserter:
    """A client's insert path: where ``step.enqueue``, ``workflow.submit`` and their variants
    hand their calls. Without ``parts`` (a unit test's context, no client), it writes only
    to a ``tx`` that brings its own target (the test recorder)."""

    def __init__(self, parts: Parts | None) -> None:
        self.parts = parts
        self.settings = None if parts is None else parts.settings
        self._owner: RunsClient = _Recorded() if parts is None else parts.owner

    def target(self, tx: object) -> Target:
        """The target that writes through ``tx`` (``None``: Cyclone's own statement; a ``tx``
        whose type has ``insert_target()``, the target that method gives)."""
        # Looked up on the type: cheaper than isinstance() on a runtime protocol, on every call.
        provides = getattr(type(tx), "insert_target", None)
        if provides is not None:
            target: Target = provides(tx)
            return target
        parts = self.parts
        if parts is None:
            raise InvalidInputError("a client is needed to enqueue or submit")
        if tx is None:
            return OwnStatement(parts.settings, parts.database, parts.publisher)
        if isinstance(tx, TrackedConnection):
            return asyncpg_caller(parts.settings, tx.connection, tx.record)
        if isinstance(tx, asyncpg.Connection | asyncpg.pool.PoolConnectionProxy):
            return asyncpg_caller(parts.settings, tx, None)
        adapter = adapter_for(tx)
        if adapter is not None:
            caller = adapter.async_target(parts.settings, parts.publisher.publish, tx)
            if caller is not None:
                return caller
        raise InvalidInputError(
            f"tx must be an asyncpg connection in a transaction, a tracked connection or a "
            f"SQLAlchemy AsyncSession/AsyncConnection on asyncpg; got {type(tx).__name__}"
        )

    async def enqueue(
        self, tx: object, kind: Kind[Any, Any], inputs: Sequence[Any], options: Mapping[str, Any]
    ) -> list[ResultRun[Any]]:
        """Insert jobs of ``kind`` through ``tx`` (None: Cyclone's own statement); their
        handles in input order."""
        target = self.target(tx)
        plan = plan_jobs(self.settings, kind, inputs, options)
        if plan.options.gated:
            run_id, created = await target.write_gated_job(plan)
            return [ResultRun(self._owner, run_id, kind.output_type, created=created)]
        if plan.ids:
            await target.write_jobs(plan)
        return [ResultRun(self._owner, i, kind.output_type, created=True) for i in plan.ids]

    async def submit(
        self,
        tx: object,
        workflow: Workflow[Any],
        key: str | None,
        input: Any,
        options: Mapping[str, Any],
        *,
        parent: tuple[uuid.UUID, str] | None = None,
    ) -> tuple[Run, bool]:
        """Submit a run of ``workflow`` through ``tx``; its handle, and whether this call
        created it (a ``submit_once`` key may name an existing run). With ``parent`` (run,
        node) the run is that node's next child."""
        target = self.target(tx)
        plan = workflow.plan(payload_limit(self.settings), key, input, options, parent)
        run_id, created = await target.write_run(plan)
        if isinstance(workflow, ResultWorkflow):
            return ResultRun(self._owner, run_id, workflow.output_type, created=created), created
        return Run(self._owner, run_id, created=created), created


class _Unwritten:
    """The runs service of a handle on a run that a test recorder recorded instead of writing
    (``cyclone.testing.new_context`` without a client): there is no run to read."""

    def __getattr__(self, name: str) -> Any:
        raise ContextError(
            "this run was recorded by a TxRecorder, not written: there is nothing to read; "
            "give new_context a client= to enqueue for real"
        )


class _RecordedParts:
    runs = cast("RunService", _Unwritten())
    streams = cast("StreamReader", _Unwritten())


class _Recorded:
    """The client of a handle from a recorded insert."""

    services = _RecordedParts()
