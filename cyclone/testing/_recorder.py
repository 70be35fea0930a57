"""A completion transaction that records instead of writing, for unit tests of handlers.

It plugs into the insert path as a target of its own (:class:`Recording`), the same way a
database target does: enqueue and submit check their input for real, then record the plan.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import msgspec

from cyclone._enqueue.targets import JobPlan, Target
from cyclone._model.ids import uuid7
from cyclone._model.options import Options

if TYPE_CHECKING:
    from cyclone._model.plans import SubmitPlan


@dataclass(frozen=True, slots=True)
class RecordedEnqueue:
    """A job a handler enqueued in its completion transaction."""

    kind: str
    input: Any
    options: Options
    run_id: uuid.UUID


@dataclass(frozen=True, slots=True)
class RecordedSubmit:
    """A workflow run a handler submitted in its completion transaction."""

    workflow: str
    input: Any
    options: Options
    run_id: uuid.UUID
    key: str | None = None


@dataclass(frozen=True, slots=True)
class RecordedQuery:
    """A statement a handler ran on its completion transaction (recorded, not run)."""

    method: str
    query: str
    args: tuple[Any, ...]


@dataclass
class TxRecorder:
    """Stands in for the completion transaction in ``cyclone.testing.new_context``.

    ``enqueue_completion`` and ``submit_completion`` are checked as for real (input types,
    payload limits, options, keys) and recorded in ``enqueued`` and ``submitted``; statements
    a handler runs on ``ctx.completion_tx()`` are recorded in ``queries``. Nothing reaches a
    database. ``fetch`` returns an empty list, ``fetchrow`` and ``fetchval`` return None.
    """

    enqueued: list[RecordedEnqueue] = field(default_factory=list)
    submitted: list[RecordedSubmit] = field(default_factory=list)
    queries: list[RecordedQuery] = field(default_factory=list)

    async def open(self) -> TxRecorder:
        """The recorder is its own connection."""
        return self

    @property
    def connection(self) -> TxRecorder:
        """The recorder: it has the methods handlers call on a connection."""
        return self

    def insert_target(self) -> Target:
        """Where enqueue and submit through this recorder go: into its lists."""
        return Recording(self)

    def is_in_transaction(self) -> bool:
        """Always in a transaction, as a completion transaction is."""
        return True

    async def execute(self, query: str, *args: Any, **_: Any) -> str:
        """Record a statement; returns an empty status."""
        self.queries.append(RecordedQuery("execute", query, args))
        return ""

    async def fetch(self, query: str, *args: Any, **_: Any) -> list[Any]:
        """Record a query; returns no rows."""
        self.queries.append(RecordedQuery("fetch", query, args))
        return []

    async def fetchrow(self, query: str, *args: Any, **_: Any) -> None:
        """Record a query; returns no row."""
        self.queries.append(RecordedQuery("fetchrow", query, args))

    async def fetchval(self, query: str, *args: Any, **_: Any) -> None:
        """Record a query; returns no value."""
        self.queries.append(RecordedQuery("fetchval", query, args))


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

    async def write_gated_job(self, plan: JobPlan) -> tuple[uuid.UUID, bool]:
        """Record the job (its debounce or throttle in its options); a recorded run is
        always new."""
        await self.write_jobs(plan)
        return plan.ids[0], True

    async def write_run(self, plan: SubmitPlan) -> tuple[uuid.UUID, bool]:
        """Record the submit; a recorded run is always new."""
        run_id = uuid7()
        self.recorder.submitted.append(
            RecordedSubmit(plan.name, plan.input, plan.options, run_id, plan.key)
        )
        return run_id, True


class StreamRecorder:
    """Stands in for a run's stream and progress in a unit test
    (``new_context(stream=recorder)``): ``items`` holds each value the handler streamed, in
    order, and ``reports`` each progress value it reported (none throttled), both decoded
    as plain JSON."""

    report_interval = 0.0

    def __init__(self) -> None:
        self.items: list[Any] = []
        self.reports: list[Any] = []

    async def append(self, run_id: uuid.UUID, node: str, attempt: int, item: str) -> int:
        """Record a streamed item; its offset (1 for the first)."""
        self.items.append(msgspec.json.decode(item))
        return len(self.items)

    async def report(self, run_id: uuid.UUID, node: str, attempt: int, value: str) -> None:
        """Record a progress report."""
        self.reports.append(msgspec.json.decode(value))
