"""Write targets: where the insert path (``cyclone._enqueue.insert``) writes a plan, and
what becomes of its wakeups.

:class:`DatabaseTarget` holds the statements and their retry rules, written once; a subclass
says where the connection comes from: :class:`CallerTransaction` is the caller's open
transaction, never begun or committed here; ``cyclone._enqueue.insert.OwnStatement`` and the
synchronous client's targets are Cyclone's own statements, committed there.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import asyncpg
import msgspec

from cyclone._enqueue import gates
from cyclone._model import codec
from cyclone._model.errors import (
    DuplicateError,
    InvalidInputError,
    KeyContentionError,
    SubmitConflictError,
)
from cyclone._model.ids import uuid7
from cyclone._model.keyring import Keyring, is_sealed, reveal
from cyclone._model.options import Options
from cyclone._services import transitions
from cyclone._services.layout import Layout
from cyclone._services.observe import Observers
from cyclone._storage import queries as db
from cyclone._storage.loader import Queries

if TYPE_CHECKING:
    from cyclone._model.plans import SubmitPlan
    from cyclone._model.steps import Kind

logger = logging.getLogger("cyclone")

# A duplicate's holder can end between our insert and our look-up; then we insert again.
_UNIQUE_TRIES = 3
# A submit key's run can be purged between our insert and our look-up; then we insert again.
_KEY_TRIES = 3
NOT_IN_TRANSACTION = (
    "a *_tx call needs a connection inside a transaction (async with conn.transaction())"
)


@dataclass(frozen=True, slots=True)
class InsertSettings:
    """What the insert path takes of a client (``cyclone.Client`` or ``cyclone.sync.Client``):
    its statements, its input limit, the observers its enqueues are reported to, the
    keyring that seals its inputs (None: stored in the clear) and the layout of its
    database (a caller's transaction on a Citus coordinator is marked for two phases)."""

    queries: Queries
    payload_limit: int
    observers: Observers
    cipher: Keyring | None = None
    layout: Layout = field(kw_only=True)


@dataclass(frozen=True, slots=True)
class JobPlan:
    """Standalone jobs to insert: checked, encoded (the inputs as one JSON array text), with
    their ids."""

    kind: Kind[Any, Any]
    inputs: Sequence[Any]
    encoded: str
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

    async def write_gated_job(self, plan: JobPlan) -> tuple[uuid.UUID, bool]:
        """Write the one job of ``plan``, which has a debounce or throttle: the run it names
        and whether this call made it."""
        ...


class DatabaseTarget:
    """A target that writes: the statements and their retries, for every connection source.

    A subclass says where the connection comes from (:meth:`connection`), what NOTIFY an
    insert may carry (:meth:`carrying`) and what to do with a wakeup (:meth:`woke`: called
    once the write is done, and after its commit when the target commits it itself).
    """

    # The errors a driver raises for a NOTIFY that cannot be queued (SQLSTATE 54000).
    notify_full: tuple[type[BaseException], ...] = (asyncpg.ProgramLimitExceededError,)

    def __init__(self, settings: InsertSettings) -> None:
        self.settings = settings

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
        kind, opts, observers = plan.kind, plan.options, self.settings.observers
        assert not opts.gated, "its run may be another's: write_gated_job says which"
        span: dict[str, str | int] = {"cyclone.kind": kind.name, "cyclone.queue": plan.queue}
        span["cyclone.count"] = len(plan.ids)
        with observers.enqueue_span(f"enqueue {kind.name}", span):
            trace = trace_text(self.settings)  # the enqueue span's: a handler's parent
            async with self.connection(transaction=opts.sequence is not None) as conn:
                carried = await self._insert_jobs(conn, plan, trace)
            if opts.claimable_now() and not carried:
                self.woke([plan.queue])
        observers.enqueued(kind.name, plan.queue, len(plan.ids))

    async def _insert_jobs(self, conn: db.Conn, plan: JobPlan, trace: str | None) -> bool:
        """Insert; return whether the statement carried its own wakeup."""
        q, opts, kind = self.settings.queries, plan.options, plan.kind
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
                        expires_at=opts.expires_at,
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

    async def write_gated_job(self, plan: JobPlan) -> tuple[uuid.UUID, bool]:
        """Write a debounced or throttled job (``cyclone._enqueue.gates``): the run it names
        and whether this call made it. Only a merge needs a transaction of its own."""
        kind, observers = plan.kind, self.settings.observers
        span: dict[str, str | int] = {"cyclone.kind": kind.name, "cyclone.queue": plan.queue}
        with observers.enqueue_span(f"enqueue {kind.name}", span):
            trace = trace_text(self.settings)
            opts = plan.options
            job = db.GatedJob(
                id=plan.ids[0],
                input=plan.encoded[1:-1],  # the array's one element
                kind=kind.name,
                queue=plan.queue,
                priority=kind.priority if opts.priority is None else opts.priority,
                max_attempts=kind.max_attempts if opts.max_attempts is None else opts.max_attempts,
                deadline=opts.run_deadline,
                trace=trace,
                group=opts.group,
            )
            async with self.connection(transaction=gates.merges(opts)) as conn:
                written = await gates.write(
                    conn,
                    self.settings.queries,
                    job,
                    kind=kind,
                    value=plan.inputs[0],
                    options=opts,
                    limit=self.settings.payload_limit,
                )
            if written.due:
                self.woke([plan.queue])
        if written.created:
            observers.enqueued(kind.name, plan.queue, 1)
        return written.run_id, written.created

    async def write_run(self, plan: SubmitPlan) -> tuple[uuid.UUID, bool]:
        """Insert the run, its steps and edges in one statement; with a key already taken,
        compare inputs (same: the existing run; different: :class:`SubmitConflictError`)."""
        observers = self.settings.observers
        sealed = self._sealed(plan)
        span = {"cyclone.workflow": plan.name, "cyclone.nodes": plan.node_count}
        with observers.enqueue_span(f"submit {plan.name}", span):
            run_id, created = await self._insert_run(sealed, trace_text(self.settings), plan)
        if created:
            for queue in plan.queues:
                observers.enqueued(plan.name, queue, 1)
        return run_id, created

    async def write_children(self, plans: Sequence[SubmitPlan]) -> list[uuid.UUID]:
        """Write child runs without map nodes, joins or branches (their parent runs locked by
        the caller) in one statement; their ids, in plan order. One whose key was taken
        already goes through write_run, which finds the run the key names and links it."""
        trace = trace_text(self.settings)
        ids = [uuid7() for _ in plans]
        runs: tuple[list[Any], ...] = tuple([] for _ in range(9))
        nodes: tuple[list[Any], ...] = tuple([] for _ in range(7))
        edges: tuple[list[Any], ...] = ([], [], [])
        for run_id, plan in zip(ids, plans, strict=True):
            assert plan.parent is not None and plan.shape is None and not plan.root_maps
            encoded = self._sealed(plan).encoded
            row = (run_id, plan.name, encoded, plan.result_node, plan.key)
            for column, value in zip(
                runs, (*row, plan.node_count, trace, *plan.parent), strict=True
            ):
                column.append(value)
            nodes[0].extend([run_id] * plan.node_count)
            for column, values in zip(nodes[1:], plan.nodes, strict=True):
                column.extend(values)
            edges[0].extend([run_id] * len(plan.edges[0]))
            edges[1].extend(plan.edges[0])
            edges[2].extend(plan.edges[1])
        async with self.connection(transaction=False) as conn:
            rows = await db.child_insert_many(
                conn, self.settings.queries, db.ChildRuns(runs, nodes, edges)
            )
        written = {uuid.UUID(r["value"]) for r in rows if r["what"] == "run"}
        self.woke(sorted(r["value"] for r in rows if r["what"] == "queue"))
        found = []
        for run_id, plan in zip(ids, plans, strict=True):
            if run_id not in written:
                run_id, _ = await self.write_run(plan)
            else:
                for queue in plan.queues:
                    self.settings.observers.enqueued(plan.name, queue, 1)
            found.append(run_id)
        return found

    def _sealed(self, plan: SubmitPlan) -> SubmitPlan:
        """``plan`` with its input sealed by the client's keyring, if it has one."""
        cipher = self.settings.cipher
        if cipher is None:
            return plan
        if plan.compares_outputs:
            # A branch compares its parent's stored output with its value in SQL: a sealed
            # output never equals it, so the branch would silently never be taken. (A branch
            # on an event compares the event's name, which is not sealed.)
            raise InvalidInputError(
                f"workflow {plan.name!r} has branches (node.when(...)), which compare outputs in "
                "the database and cannot work on sealed outputs: branch in the handler "
                "instead, or submit it with a client without a keyring"
            )
        return dataclasses.replace(plan, encoded=cipher.seal(plan.encoded))

    async def _insert_run(
        self, plan: SubmitPlan, trace: str | None, clear: SubmitPlan
    ) -> tuple[uuid.UUID, bool]:
        """Insert ``plan`` (its input as stored); ``clear``: the same plan, its input as
        encoded, which submit_once compares with a sealed stored input."""
        q = self.settings.queries
        queues = set(plan.queues)
        # Root map nodes over a non-empty list grow their items in the insert; over anything
        # else (which may complete or fail them), in its transaction. A child run is written
        # and linked in one.
        grow = plan.grows_root_maps
        expand = bool(plan.root_maps) and not grow
        async with self.connection(transaction=expand or plan.parent is not None) as conn:
            for _ in range(_KEY_TRIES):
                run_id = uuid7()
                inserted = await db.workflow_insert(
                    conn, q, run_id, *plan.arguments(trace), shape=plan.shape, grow_maps=grow
                )
                if inserted is not None:
                    if grow:
                        queues |= plan.root_map_queues
                    if expand:
                        roots = list(plan.root_maps)
                        effects = transitions.Effects()
                        done = await transitions.expand_maps(
                            conn, q, [run_id] * len(roots), roots, effects, plan.options.process_at
                        )
                        effects.merge(await transitions.advance(conn, q, done.run_ids, done.nodes))
                        queues |= effects.queues
                    break
                assert plan.key is not None  # only a keyed insert can insert nothing
                existing = await db.workflow_find_key(conn, q, plan.name, plan.key, plan.encoded)
                if existing is not None:
                    if not existing["same_input"] and not self._same_sealed(existing, clear):
                        raise SubmitConflictError(plan.name, plan.key, existing["id"])
                    await self._link(conn, plan, existing["id"])
                    return existing["id"], False
                # The key's run was purged between the two statements: the key is free again.
            else:
                raise KeyContentionError("submit", str(plan.key), plan.name)
            await self._link(conn, plan, inserted)
        if plan.options.claimable_now():
            self.woke(sorted(queues))
        return inserted, True

    def _same_sealed(self, existing: db.Record, clear: SubmitPlan) -> bool:
        """Whether the stored input, sealed (random nonces never compare equal as jsonb) or
        written before sealing was turned on, equals ``clear``'s once opened: equal as
        jsonb, so key order does not matter (nor 1 against 1.0)."""
        stored: str = existing["input"]
        if self.settings.cipher is None and not is_sealed(stored):
            return False  # both in the clear: jsonb said it
        stored = reveal(self.settings.cipher, stored)
        return bool(msgspec.json.decode(stored) == msgspec.json.decode(clear.encoded))

    async def _link(self, conn: db.Conn, plan: SubmitPlan, run_id: uuid.UUID) -> None:
        """Make a child run its parent node's child (on the child's transaction)."""
        if plan.parent is not None:
            await db.child_link(conn, self.settings.queries, run_id, *plan.parent)


class CallerTransaction(DatabaseTarget):
    """The caller's open transaction: never begun, committed or rolled back here.

    ``open`` gives the driver's connection (raising :class:`NotInTransactionError` when no
    transaction is open); ``record`` takes each wakeup for after the commit (None: the caller
    does not track them, and workers find the work at their next poll).
    """

    def __init__(
        self,
        settings: InsertSettings,
        open: Callable[[], contextlib.AbstractAsyncContextManager[Any]],
        record: Callable[[str], None] | None,
        *,
        notify_full: tuple[type[BaseException], ...] = DatabaseTarget.notify_full,
    ) -> None:
        super().__init__(settings)
        self._open = open
        self._record = record
        self.notify_full = notify_full

    def connection(self, *, transaction: bool) -> contextlib.AbstractAsyncContextManager[Any]:
        layout = self.settings.layout  # on Citus, the transaction is marked for two phases
        return self._open() if layout.citus is False else layout.marked(self._open())

    def woke(self, queues: Sequence[str]) -> None:
        if self._record is not None:
            for queue in queues:
                self._record(queue)


def trace_text(settings: InsertSettings | None) -> str | None:
    """The current trace context as JSON text, to store with runs written now."""
    carrier = None if settings is None else settings.observers.trace_context()
    return None if carrier is None else codec.encode_plain(carrier)
