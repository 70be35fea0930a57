"""The one insert path behind every enqueue and submit variant, on either driver.

A call is checked and turned into a plan (:class:`JobPlan`, or the workflow's
:class:`~cyclone._workflow.SubmitPlan`) before the first statement, so bad input writes
nothing. A :class:`Target` then writes the plan: where the connection comes from and what
happens to the wakeup are the target's, the statements and their retry rules are
:class:`DatabaseTarget`'s, written once:

- :class:`OwnStatement`: ``tx is None``; Cyclone takes a pooled connection, writes (one
  autocommit statement, or a short transaction for a sequence lock) and publishes the wakeup.
- :class:`CallerTransaction`: the caller's open transaction (a raw asyncpg connection, a
  tracked one, a completion transaction, a SQLAlchemy session); never begins, commits or rolls
  it back, and hands the wakeup to the transaction's tracker, if it has one, for after commit.
- the synchronous client's targets (``cyclone.sync``) run the same coroutines on psycopg.
- :class:`~cyclone._recorder.TxRecorder` records plans instead of writing them.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import asyncpg
from asyncpg.pgproto.pgproto import UUID as PgUUID

from cyclone import _codec
from cyclone import _queries as db
from cyclone._codec import DEFAULT_PAYLOAD_LIMIT
from cyclone._errors import (
    DuplicateError,
    InvalidInputError,
    KeyContentionError,
    NotInTransactionError,
    SubmitConflictError,
)
from cyclone._notifier import queue_payload
from cyclone._observe import Observers
from cyclone._options import EnqueueOptions, Options, parse
from cyclone._recorder import RecordedEnqueue, RecordedSubmit, TxRecorder
from cyclone._run import ResultRun
from cyclone._sql import Queries
from cyclone._wakeups import TrackedConnection

if TYPE_CHECKING:
    from cyclone._client import Client
    from cyclone._kinds import Kind
    from cyclone._workflow import SubmitPlan

logger = logging.getLogger("cyclone")

# The option names a call takes at run time are the keys its TypedDict gives a type checker.
ENQUEUE_OPTIONS = EnqueueOptions.__optional_keys__
# A duplicate's holder can end between our insert and our look-up; then we insert again.
_UNIQUE_TRIES = 3
# A submit key's run can be purged between our insert and our look-up; then we insert again.
_KEY_TRIES = 3
NOT_IN_TRANSACTION = (
    "a *_tx call needs a connection inside a transaction (async with conn.transaction())"
)


def uuid7_many(n: int) -> list[uuid.UUID]:
    """``n`` time-ordered UUIDs (version 7), ascending in the order asked for.

    Runs list newest-first by id, and inserts stay at the right edge of the primary key. One
    clock read and one random draw per batch (RFC 9562, "monotonic random"): the first id takes
    73 random bits under the millisecond, the others count up from it, so two batches of the
    same millisecond would have to draw overlapping ranges out of 2**73 to collide. They are
    asyncpg's own UUID type (a :class:`uuid.UUID`), which it builds and sends in C.
    """
    millis = (time.time_ns() // 1_000_000) & ((1 << 48) - 1)
    rand = int.from_bytes(os.urandom(10), "big")
    # 12 random bits in rand_a; 61 in rand_b, whose top bit stays clear so counting never
    # reaches the variant bits.
    first = millis << 80 | 0x7 << 76 | (rand >> 68) << 64 | 0b10 << 62 | (rand & ((1 << 61) - 1))
    return [PgUUID((first + i).to_bytes(16, "big")) for i in range(n)]


def uuid7() -> uuid.UUID:
    """One time-ordered UUID; see :func:`uuid7_many`."""
    return uuid7_many(1)[0]


def check_options(options: Mapping[str, Any], allowed: frozenset[str], *, call: str) -> Options:
    """Reject unknown option names, then parse the rest."""
    unknown = sorted(set(options) - allowed)
    if unknown:
        known = ", ".join(sorted(allowed))
        raise InvalidInputError(
            f"unknown option(s) {', '.join(unknown)} for {call}; known: {known}"
        )
    return parse(**options)


class Producer(Protocol):
    """What the insert path needs of a client (``cyclone.Client`` or ``cyclone.sync.Client``)."""

    @property
    def queries(self) -> Queries: ...
    @property
    def payload_limit(self) -> int: ...
    @property
    def observers(self) -> Observers: ...


@dataclass(frozen=True, slots=True)
class JobPlan:
    """Standalone jobs to insert: checked, encoded, with their ids."""

    kind: Kind[Any, Any]
    inputs: Sequence[Any]
    encoded: list[str]
    ids: list[uuid.UUID]
    options: Options
    queue: str


class Target(Protocol):
    """Where a plan is written and what is done with its wakeups."""

    async def write_jobs(self, plan: JobPlan) -> None:
        """Insert the jobs of ``plan``."""
        ...

    async def write_run(self, plan: SubmitPlan) -> tuple[uuid.UUID, bool]:
        """Insert the workflow run of ``plan``; return its id and whether this call made it."""
        ...


class DatabaseTarget:
    """A target that writes: the statements and their retries, for every connection source.

    A subclass says where the connection comes from (:meth:`connection`), what NOTIFY an
    insert may carry (:meth:`carrying`) and what to do with a wakeup (:meth:`woke`: called
    once the write is done, and after its commit when the target commits it itself).
    """

    # The errors a driver raises for a NOTIFY that cannot be queued (SQLSTATE 54000).
    notify_full: tuple[type[BaseException], ...] = (asyncpg.ProgramLimitExceededError,)

    def __init__(self, producer: Producer) -> None:
        self.producer = producer

    def connection(self, *, transaction: bool) -> contextlib.AbstractAsyncContextManager[Any]:
        """The connection to write on; ``transaction``: the write needs one of its own (a
        sequence lock lasts until commit)."""
        raise NotImplementedError

    def carrying(self, queue: str) -> contextlib.AbstractContextManager[tuple[str, str] | None]:
        """The (channel, payload) the insert statement may send itself, or None."""
        return contextlib.nullcontext()

    def woke(self, queues: Sequence[str]) -> None:
        """``queues`` got claimable work that no statement announced."""

    async def write_jobs(self, plan: JobPlan) -> None:
        """Insert the jobs of ``plan``, taking the sequence lock first if it has one."""
        kind, opts, observers = plan.kind, plan.options, self.producer.observers
        span: dict[str, str | int] = {"cyclone.kind": kind.name, "cyclone.queue": plan.queue}
        span["cyclone.count"] = len(plan.ids)
        with observers.enqueue_span(f"enqueue {kind.name}", span):
            trace = trace_text(self.producer)  # the enqueue span's: a handler's parent
            async with self.connection(transaction=opts.sequence is not None) as conn:
                carried = await self._insert_jobs(conn, plan, trace)
            if opts.claimable_now() and not carried:
                self.woke([plan.queue])
        observers.enqueued(kind.name, plan.queue, len(plan.ids))

    async def _insert_jobs(self, conn: db.Conn, plan: JobPlan, trace: str | None) -> bool:
        """Insert; return whether the statement carried its own wakeup."""
        q, opts, kind = self.producer.queries, plan.options, plan.kind
        if opts.sequence is not None:
            await db.sequence_lock(conn, q, kind.name, opts.sequence)
        inline = opts.sequence is None and opts.claimable_now()
        max_attempts = kind.max_attempts if opts.max_attempts is None else opts.max_attempts
        with self.carrying(plan.queue) if inline else contextlib.nullcontext() as notify:
            for _ in range(_UNIQUE_TRIES):
                try:
                    inserted = await db.job_insert_many(
                        conn,
                        q,
                        ids=plan.ids,
                        inputs=plan.encoded,
                        kind=kind.name,
                        queue=plan.queue,
                        priority=kind.priority if opts.priority is None else opts.priority,
                        process_at=opts.process_at,
                        max_attempts=max_attempts,
                        sequence=opts.sequence,
                        unique=opts.unique,
                        deadline=opts.run_deadline,
                        trace=trace,
                        notify=notify,
                        group=opts.group,
                    )
                except self.notify_full as exc:
                    if notify is None or "NOTIFY queue" not in str(exc):
                        raise
                    # The server's notification queue is full (a listener stuck in a long
                    # transaction): the commit failed, taking the insert with it. Insert again
                    # without the NOTIFY; its wakeup is then published after the commit.
                    logger.warning(
                        "enqueueing %s on queue %s without its NOTIFY (%s); workers "
                        "find it at their next poll",
                        kind.name,
                        plan.queue,
                        exc,
                    )
                    notify = None
                    continue
                if inserted or opts.unique is None:
                    return notify is not None
                holder = await db.job_find_unique(conn, q, kind.name, opts.unique)
                if holder is not None:
                    raise DuplicateError(kind.name, opts.unique, holder)
        raise KeyContentionError("unique", str(opts.unique), kind.name)

    async def write_run(self, plan: SubmitPlan) -> tuple[uuid.UUID, bool]:
        """Insert the run, its steps and edges in one statement; with a key already taken,
        compare inputs (same: the existing run; different: :class:`SubmitConflictError`)."""
        observers = self.producer.observers
        span = {"cyclone.workflow": plan.name, "cyclone.nodes": plan.node_count}
        with observers.enqueue_span(f"submit {plan.name}", span):
            run_id, created = await self._insert_run(plan, trace_text(self.producer))
        if created:
            for queue in plan.queues:
                observers.enqueued(plan.name, queue, 1)
        return run_id, created

    async def _insert_run(self, plan: SubmitPlan, trace: str | None) -> tuple[uuid.UUID, bool]:
        q = self.producer.queries
        async with self.connection(transaction=False) as conn:
            for _ in range(_KEY_TRIES):
                run_id = uuid7()
                inserted = await db.workflow_insert(conn, q, run_id, *plan.arguments(trace))
                if inserted is not None:
                    break
                assert plan.key is not None  # only a keyed insert can insert nothing
                existing = await db.workflow_find_key(conn, q, plan.name, plan.key, plan.encoded)
                if existing is not None:
                    if not existing["same_input"]:
                        raise SubmitConflictError(plan.name, plan.key, existing["id"])
                    return existing["id"], False
                # The key's run was purged between the two statements: the key is free again.
            else:
                raise KeyContentionError("submit", str(plan.key), plan.name)
        if plan.options.claimable_now():
            self.woke(plan.queues)
        return inserted, True


class OwnStatement(DatabaseTarget):
    """``tx is None`` on the asyncio client: a pooled connection, committed here."""

    def __init__(self, client: Client) -> None:
        super().__init__(client)
        self.client = client

    @contextlib.asynccontextmanager
    async def connection(self, *, transaction: bool) -> AsyncIterator[db.Conn]:
        # The connection's reset on release is not waited for (Client._borrow).
        async with self.client._borrow() as pooled:
            if transaction:
                async with pooled.transaction():
                    yield pooled
            else:
                yield pooled

    @contextlib.contextmanager
    def carrying(self, queue: str) -> Iterator[tuple[str, str] | None]:
        # An insert that commits on its own wakes workers itself: its NOTIFY is delivered at
        # its commit. One at a time: the server serializes notifying commits through their
        # WAL flush, so while one is in flight the others publish after their commit, merged
        # (client._publish).
        client = self.client
        if client.notify_coalesce > 0 or client._notifying:
            yield None
            return
        client._notifying += 1
        try:
            yield client.channel, queue_payload(queue)
        finally:
            client._notifying -= 1

    def woke(self, queues: Sequence[str]) -> None:
        self.client._publish([queue_payload(q) for q in sorted(queues)])


class CallerTransaction(DatabaseTarget):
    """The caller's open transaction: never begun, committed or rolled back here.

    ``open`` gives the driver's connection (raising :class:`NotInTransactionError` when no
    transaction is open); ``record`` takes each wakeup for after the commit (None: the caller
    does not track them, and workers find the work at their next poll).
    """

    def __init__(
        self,
        producer: Producer,
        open: Callable[[], contextlib.AbstractAsyncContextManager[Any]],
        record: Callable[[str], None] | None,
        *,
        notify_full: tuple[type[BaseException], ...] = DatabaseTarget.notify_full,
    ) -> None:
        super().__init__(producer)
        self._open = open
        self._record = record
        self.notify_full = notify_full

    def connection(self, *, transaction: bool) -> contextlib.AbstractAsyncContextManager[Any]:
        return self._open()

    def woke(self, queues: Sequence[str]) -> None:
        if self._record is not None:
            for queue in queues:
                self._record(queue)


class Recording:
    """The :class:`TxRecorder` as a target: plans are recorded, nothing is written."""

    def __init__(self, recorder: TxRecorder) -> None:
        self.recorder = recorder

    async def write_jobs(self, plan: JobPlan) -> None:
        """Record each job."""
        self.recorder.enqueued.extend(
            RecordedEnqueue(plan.kind.name, value, plan.options, i)
            for value, i in zip(plan.inputs, plan.ids, strict=True)
        )

    async def write_run(self, plan: SubmitPlan) -> tuple[uuid.UUID, bool]:
        """Record the submit; a recorded run is always new."""
        run_id = uuid7()
        self.recorder.submitted.append(
            RecordedSubmit(plan.name, plan.input, plan.options, run_id, plan.key)
        )
        return run_id, True


def asyncpg_caller(
    producer: Producer, conn: db.Conn, record: Callable[[str], None] | None
) -> CallerTransaction:
    """The caller's transaction on a raw asyncpg connection."""

    @contextlib.asynccontextmanager
    async def open() -> AsyncIterator[db.Conn]:
        if not conn.is_in_transaction():
            raise NotInTransactionError(NOT_IN_TRANSACTION)
        yield conn

    return CallerTransaction(producer, open, record)


def target_for(client: Client | None, tx: object) -> Target:
    """The target that writes through ``tx`` (``None``: Cyclone's own statement)."""
    if isinstance(tx, TxRecorder):
        return Recording(tx)
    if client is None:
        raise InvalidInputError("a client is needed to enqueue or submit")
    if tx is None:
        return OwnStatement(client)
    if isinstance(tx, TrackedConnection):
        return asyncpg_caller(client, tx.connection, tx.record)
    if isinstance(tx, asyncpg.Connection | asyncpg.pool.PoolConnectionProxy):
        return asyncpg_caller(client, tx, None)
    if "sqlalchemy" in sys.modules:
        from cyclone.integrations import sqlalchemy as glue

        target = glue.async_target(client, tx)
        if target is not None:
            return target
    raise InvalidInputError(
        f"tx must be an asyncpg connection in a transaction, a tracked connection or a "
        f"SQLAlchemy AsyncSession/AsyncConnection on asyncpg; got {type(tx).__name__}"
    )


def payload_limit(client: Producer | None) -> int:
    """The client's input limit; a recorder in a unit test may come without a client."""
    return DEFAULT_PAYLOAD_LIMIT if client is None else client.payload_limit


def trace_text(client: Producer | None) -> str | None:
    """The current trace context as JSON text, to store with runs written now."""
    carrier = None if client is None else client.observers.trace_context()
    return None if carrier is None else _codec.encode_plain(carrier)


def plan_jobs(
    client: Producer | None, kind: Kind[Any, Any], inputs: Sequence[Any], options: Mapping[str, Any]
) -> JobPlan:
    """Check options and inputs; the plan of what to insert (nothing is written yet)."""
    opts = check_options(options, ENQUEUE_OPTIONS, call="enqueue")
    if opts.unique is not None and len(inputs) != 1:
        raise InvalidInputError("unique= applies to a single enqueue, not to enqueue_many")
    encoded = _codec.encode_many(
        inputs, kind.input_type, what=f"input of {kind.name!r}", limit=payload_limit(client)
    )
    return JobPlan(
        kind=kind,
        inputs=inputs,
        encoded=encoded,
        ids=uuid7_many(len(encoded)),
        options=opts,
        queue=opts.queue or kind.queue,
    )


async def enqueue(
    client: Client | None,
    tx: object,
    kind: Kind[Any, Any],
    inputs: Sequence[Any],
    options: Mapping[str, Any],
) -> list[ResultRun[Any]]:
    """Insert standalone jobs of ``kind`` on the asyncio client; handles in input order."""
    target = target_for(client, tx)
    plan = plan_jobs(client, kind, inputs, options)
    if plan.ids:
        await target.write_jobs(plan)
    return [ResultRun(client, i, kind.output_type) for i in plan.ids]  # type: ignore[arg-type]
