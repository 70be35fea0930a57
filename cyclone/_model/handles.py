"""Run handles and the read models returned by the client.

A handle is an id and the client's runs service (``cyclone._services.runs``); it holds no
connection. Every operation is the runs service's, on the client's pool, so a handle from
``*_tx`` raises :class:`RunNotFoundError` until its transaction commits.
"""

from __future__ import annotations

import datetime as dt
import enum
import uuid
from collections.abc import AsyncGenerator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar, overload

from cyclone._model.options import validate_int
from cyclone._model.streams import StreamItem, StreamReader

Out = TypeVar("Out")
# A handle only gives its output out: a ResultRun[bool] is a ResultRun[int].
Out_co = TypeVar("Out_co", covariant=True)


class RunState(enum.StrEnum):
    """A run's state. ``COMPLETED``, ``FAILED``, ``CANCELLED`` and ``EXPIRED`` (a job not
    started by its expiry) are terminal."""

    PENDING = "pending"
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"
    EXPIRED = "expired"

    @property
    def terminal(self) -> bool:
        """Whether the run has ended."""
        return self in _TERMINAL


_TERMINAL = frozenset({RunState.COMPLETED, RunState.FAILED, RunState.CANCELLED, RunState.EXPIRED})


@dataclass(frozen=True, slots=True)
class NodeInfo:
    """One node (step, wait, map, map item or child) of a run.

    ``state`` is one of pending, available, scheduled, running, waiting, sleeping, completed,
    failed, cancelled, skipped. ``errors`` holds every failed attempt's error, oldest first.
    An item node of a map node has ``map_of`` (the map node's name) and ``item`` (its index);
    a child node has ``child_run``, the run it submitted last; a sleep node that is sleeping
    has ``wake_at``, its wake time.
    """

    name: str
    kind: str | None
    state: str
    attempts: int
    errors: list[dict[str, Any]]
    map_of: str | None = None
    item: int | None = None
    child_run: uuid.UUID | None = None
    wake_at: dt.datetime | None = None


def items_done(nodes: Sequence[NodeInfo]) -> dict[str, tuple[int, int]]:
    """Each map node's items: how many are done (completed or failed) of how many, by the
    map node's name."""
    counts: dict[str, tuple[int, int]] = {}
    for n in nodes:
        if n.map_of is not None:
            done, total = counts.get(n.map_of, (0, 0))
            counts[n.map_of] = (done + (n.state in ("completed", "failed")), total + 1)
    return counts


def released(error: Mapping[str, Any]) -> str | None:
    """The evidence an attempt's error keeps of its release (its worker lost, its lease
    expired), in words; None for an error of any other kind."""
    by = error.get("released_by")
    if by is None:
        return None
    worker = f"worker {error.get('worker', '?')}"
    where = [f"{k} {error[k]}" for k in ("host", "pid", "backend") if error.get(k) is not None]
    if where:
        worker += f" ({', '.join(where)})"
    facts = [worker]
    for key, label in (
        ("last_seen", "last heartbeat {}"),
        ("lock_free_since", "lock free since {}"),
        ("grace", "grace {} s"),
        ("lease_until", "lease until {}"),
    ):
        if error.get(key) is not None:
            facts.append(label.format(error[key]))
    reason = str(error.get("reason", "released")).replace("_", " ")
    return f"{reason}: released by {by} at {error.get('released_at', '?')}; " + "; ".join(facts)


@dataclass(frozen=True, slots=True)
class RunInfo:
    """What a run is and where it stands.

    ``nodes`` (by name), ``edges`` (parent, child) and ``branches`` (parent, child, value:
    the edges taken only when the parent's output equals the value, ``node.when(value)``)
    are empty in ``list_runs`` pages; ``run.info()`` fills them, and ``input`` and ``output``
    (the run's input and the output of a job or of a result workflow's result node, decoded
    as plain JSON values; ``None`` until there is one, and in ``list_runs`` pages). A child
    run has ``parent_run`` and ``parent_node``: the run and child node that submitted it
    (``run.info()`` only). A fork (``client.fork``) has ``forked_from``: the run it was forked
    from and the node it re-ran from; ``forks`` lists the runs forked from this one, oldest
    first, each with its node (``run.info()`` only).
    """

    id: uuid.UUID
    name: str
    key: str | None
    state: RunState
    created_at: dt.datetime
    finished_at: dt.datetime | None
    error: dict[str, Any] | None
    job: bool
    nodes: list[NodeInfo] = field(default_factory=list)
    edges: list[tuple[str, str]] = field(default_factory=list)
    branches: list[tuple[str, str, Any]] = field(default_factory=list)
    input: Any = None
    output: Any = None
    parent_run: uuid.UUID | None = None
    parent_node: str | None = None
    forked_from: tuple[uuid.UUID, str] | None = None
    forks: list[tuple[uuid.UUID, str]] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class RunQuery:
    """Filters for ``client.list_runs``; every one is optional. Newest runs come first.

    A page is found by walking runs from the newest back (by their time-ordered ids) until
    ``limit`` match, so a filter that few recent runs match reads further into the history;
    keep the history bounded with :class:`Retention`, or bound the walk with ``scan``. A
    ``cursor`` starts the walk where the previous page ended.
    """

    name: str | None = None
    state: RunState | list[RunState] | None = None
    key: str | None = None
    created_after: dt.datetime | None = None
    created_before: dt.datetime | None = None
    limit: int = 100
    cursor: str | None = None
    #: A job's queue, or the queue of any node of a workflow run.
    queue: str | None = None
    #: Read at most this many runs (from the cursor back) to fill the page: the page may then
    #: be short, with a ``next_cursor`` that continues the walk. ``None`` reads on until the
    #: page is full or the history ends.
    scan: int | None = None


@dataclass(frozen=True, slots=True)
class RunPage:
    """One page of runs; pass ``next_cursor`` back as ``RunQuery.cursor`` for the next."""

    runs: list[RunInfo]
    next_cursor: str | None


class RunService(Protocol):
    """The reads and actions a handle delegates to (``cyclone._services.runs.Runs``)."""

    async def status(self, run_id: uuid.UUID) -> RunState:
        """The run's state."""
        ...

    async def wait(self, run_id: uuid.UUID, timeout: float | None) -> RunState:
        """The run's state once it ends."""
        ...

    async def result(self, run_id: uuid.UUID, output_type: Any, timeout: float | None) -> Any:
        """The run's decoded output once it ends."""
        ...

    async def info(self, run_id: uuid.UUID) -> RunInfo:
        """The run with its nodes."""
        ...

    async def payloads(self, run_id: uuid.UUID) -> RunPayloads:
        """The run's stored payloads."""
        ...

    async def cancel(self, run_id: uuid.UUID) -> bool:
        """Cancel the run."""
        ...

    async def retry(self, run_id: uuid.UUID, node: str | None) -> None:
        """Re-open a failed run, or one failed node of it."""
        ...


class RunServices(Protocol):
    """The part of a client a handle keeps (``cyclone._services.bundle.Services``)."""

    @property
    def runs(self) -> RunService:
        """Run reads and actions."""
        ...

    @property
    def streams(self) -> StreamReader:
        """Progress and stream reads."""
        ...


class RunsClient(Protocol):
    """What a handle is given as ``client``: a :class:`cyclone.Client`, whose runs service
    it keeps."""

    @property
    def services(self) -> RunServices:
        """The client's parts (the handle keeps its runs service)."""
        ...


class Run:
    """A handle on one run. ``created``: whether the call that gave it wrote the run (False:
    a debounced or throttled enqueue, or ``submit_once``, named a run that existed)."""

    __slots__ = ("_runs", "_streams", "created", "id")

    def __init__(self, client: RunsClient, run_id: uuid.UUID, *, created: bool = False) -> None:
        self._runs: RunService = client.services.runs
        self._streams: StreamReader = client.services.streams
        self.id = run_id
        self.created = created

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.id}>"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Run) and other.id == self.id

    def __hash__(self) -> int:
        return hash(self.id)

    async def status(self) -> RunState:
        """The run's current state."""
        return await self._runs.status(self.id)

    async def wait(self, timeout: float | None = None) -> RunState:
        """Wait until the run ends and return its state; ``TimeoutError`` after ``timeout``.

        A job not started by its expiry ends :attr:`RunState.EXPIRED`. A run of a kind that
        keeps nothing once completed is deleted as it completes: waiting for it then raises
        :class:`RunNotFoundError` (its failures, cancellations and expiries are kept).
        """
        return await self._runs.wait(self.id, timeout)

    async def info(self) -> RunInfo:
        """The run with its per-node states, attempts and errors."""
        return await self._runs.info(self.id)

    async def cancel(self) -> bool:
        """Cancel the run; True if this call cancelled it.

        A pending or running run is cancelled (its running handlers stop within a heartbeat),
        and so is a failed one (a failed sequenced job then stops blocking its sequence). A
        completed, cancelled or expired run is left as it is: False.
        """
        return await self._runs.cancel(self.id)

    async def retry_all(self) -> None:
        """Re-open a failed run: every failed node gets a fresh attempt budget."""
        await self._runs.retry(self.id, None)

    async def payloads(self) -> RunPayloads:
        """The run's input and output, and each node's output and signal payload (decoded
        JSON, untyped: for display and inspection)."""
        return await self._runs.payloads(self.id)

    async def retry(self, node: str) -> None:
        """Reset one failed node; the run re-opens once no failed node is left.

        A job's one node is named after its kind. :class:`UnknownKindError` if the run has
        no such node, :class:`InvalidStateError` if it has not failed.
        """
        await self._runs.retry(self.id, node)

    async def progress(self) -> dict[str, Any]:
        """The latest progress each node reported (``ctx.report``), by node name (a job's
        under its kind), decoded as plain JSON; nodes that never reported are left out."""
        return await self._streams.progress(self.id)

    def stream(
        self, after: int = 0, *, node: str | None = None
    ) -> AsyncGenerator[StreamItem, None]:
        """The run's stream items (``ctx.stream``) past offset ``after``, in order, as they
        are written, ending when the run ends (after every item written before its end).

        Use it with ``async for``. To resume, pass the offset of the last item handled: no
        item is missed or repeated. ``node`` keeps one node's items (offsets stay the run's).
        """
        validate_int(after, what="after", low=0, high=2**63 - 1)
        return self._streams.items(self.id, after, node)


class ResultRun(Run, Generic[Out_co]):
    """A handle on a run of a result workflow (or a job): ``result()`` gives its output.

    ``ResultRun(client, run_id, int)`` is a ``ResultRun[int]``; an output type a type checker
    cannot read as a class (``int | None``) gives ``ResultRun[Any]``, to annotate.
    """

    __slots__ = ("output_type",)

    @overload
    def __init__(
        self: ResultRun[Out],
        client: RunsClient,
        run_id: uuid.UUID,
        output_type: type[Out],
        *,
        created: bool = False,
    ) -> None: ...
    @overload
    def __init__(
        self: ResultRun[Any],
        client: RunsClient,
        run_id: uuid.UUID,
        output_type: Any,
        *,
        created: bool = False,
    ) -> None: ...
    def __init__(
        self, client: RunsClient, run_id: uuid.UUID, output_type: Any, *, created: bool = False
    ) -> None:
        super().__init__(client, run_id, created=created)
        self.output_type = output_type

    async def result(self, timeout: float | None = None) -> Out_co:
        """Wait for the run and return its typed output.

        Raises :class:`RunFailedError`, :class:`RunCancelledError`,
        :class:`RunExpiredError` (a job not started by its expiry), or
        :class:`NoOutputError` when the run has no result node. A run whose kind keeps
        nothing once completed (``Retention(completed=KEEP_NOTHING)``) is deleted as it
        completes, so this raises :class:`RunNotFoundError` for it.
        """
        result: Out_co = await self._runs.result(self.id, self.output_type, timeout)
        return result


# Read models for dashboards (cyclone.web).


@dataclass(frozen=True, slots=True)
class NodePayloads:
    """One workflow node's queue, output (``None`` until it completes) and, for a wait node,
    the signal payload it got (``signalled`` tells a ``None`` payload from no signal)."""

    queue: str
    output: Any
    signal: Any
    signalled: bool


@dataclass(frozen=True, slots=True)
class RunPayloads:
    """A run's input and output as stored, decoded as plain JSON values.

    ``output`` is a job's output or a result workflow's result node's (``None`` before it
    completes or when there is none); ``nodes`` maps each node of a workflow run to its
    :class:`NodePayloads` (empty for a job).
    """

    input: Any
    output: Any
    nodes: dict[str, NodePayloads]
