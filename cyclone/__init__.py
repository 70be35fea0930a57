"""Cyclone: durable jobs and DAG workflows in your application's own PostgreSQL.

Everything public is re-exported here; the modules behind it are private.
"""

from __future__ import annotations

import importlib.metadata
import inspect
from collections.abc import Sequence
from typing import TYPE_CHECKING, TypeVar, Unpack, overload

from cyclone._client import BatchContext, Client, Context
from cyclone._enqueue import insert as _insert
from cyclone._enqueue.wakeups import (
    TrackedConnection,
    TrackedTransaction,
    track_wakeups,
)
from cyclone._model import ports as _ports
from cyclone._model import results as _workflows
from cyclone._model import steps
from cyclone._model.batches import BatchStep, ItemFailed, batch_action, batch_step
from cyclone._model.context import Snooze
from cyclone._model.debounce import Debounce, Throttle
from cyclone._model.errors import (
    ConflictError,
    ContextError,
    CycloneError,
    DuplicateError,
    InvalidInputError,
    InvalidKeyError,
    InvalidLimitError,
    InvalidNameError,
    InvalidOptionError,
    InvalidScheduleError,
    InvalidStateError,
    KeyContentionError,
    KeyringError,
    LifecycleError,
    NoOutputError,
    NotFoundError,
    NotInTransactionError,
    PayloadTooLargeError,
    ReadOnlyServerError,
    RunCancelledError,
    RunExpiredError,
    RunFailedError,
    RunNotFoundError,
    RunOutcomeError,
    ScheduleNotFoundError,
    SchemaNotMigratedError,
    SchemaVersionError,
    SetupError,
    StateError,
    SubmitConflictError,
    UnknownKindError,
    UnknownNodeError,
    UnknownQueueError,
    UnsupportedLayoutError,
    UnsupportedPoolerError,
)
from cyclone._model.events import Event, EventNode
from cyclone._model.explain import Explanation, LimitReached, Reason, ReasonCode
from cyclone._model.handles import (
    NodeInfo,
    NodePayloads,
    ResultRun,
    Run,
    RunInfo,
    RunPage,
    RunPayloads,
    RunQuery,
    RunState,
)
from cyclone._model.keyring import Keyring
from cyclone._model.nodes import MAX_ITEMS, Branch, Node
from cyclone._model.options import EnqueueManyOptions, EnqueueOptions, SubmitOptions
from cyclone._model.ports import Tx
from cyclone._model.results import ResultWorkflow, define, define_result
from cyclone._model.retention import KEEP_NOTHING, Retention
from cyclone._model.schedules import (
    Schedule,
    schedule,
)
from cyclone._model.settled import Settled
from cyclone._model.stats import QueueStats, Throughput, UnservedWork, WorkerInfo
from cyclone._model.steps import Kind, Step, action, register_kind, step
from cyclone._model.streams import StreamItem
from cyclone._model.wakeups import Wakeups
from cyclone._model.workflows import Workflow
from cyclone._services.keys import Keys
from cyclone._services.observe import Observer
from cyclone._services.queues import KindLimits, QueueLimits, Queues, QueueSettings
from cyclone._services.schedules import ScheduleInfo, Schedules
from cyclone._worker.worker import Worker, exponential_backoff

In = TypeVar("In")
Out = TypeVar("Out")

try:
    __version__ = importlib.metadata.version("cyclone-pg")
    """The installed cyclone-pg's version, as ``cyclone --version`` prints it."""
except importlib.metadata.PackageNotFoundError:  # a source tree on sys.path, never installed
    __version__ = "0+unknown"

__all__ = [
    "KEEP_NOTHING",
    "MAX_ITEMS",
    "BatchContext",
    "BatchStep",
    "Branch",
    "Client",
    "ConflictError",
    "Context",
    "ContextError",
    "CycloneError",
    "Debounce",
    "DuplicateError",
    "EnqueueManyOptions",
    "EnqueueOptions",
    "Event",
    "EventNode",
    "Explanation",
    "InvalidInputError",
    "InvalidKeyError",
    "InvalidLimitError",
    "InvalidNameError",
    "InvalidOptionError",
    "InvalidScheduleError",
    "InvalidStateError",
    "ItemFailed",
    "KeyContentionError",
    "Keyring",
    "KeyringError",
    "Keys",
    "Kind",
    "KindLimits",
    "LifecycleError",
    "LimitReached",
    "NoOutputError",
    "Node",
    "NodeInfo",
    "NodePayloads",
    "NotFoundError",
    "NotInTransactionError",
    "Observer",
    "PayloadTooLargeError",
    "QueueLimits",
    "QueueSettings",
    "QueueStats",
    "Queues",
    "ReadOnlyServerError",
    "Reason",
    "ReasonCode",
    "ResultRun",
    "ResultWorkflow",
    "Retention",
    "Run",
    "RunCancelledError",
    "RunExpiredError",
    "RunFailedError",
    "RunInfo",
    "RunNotFoundError",
    "RunOutcomeError",
    "RunPage",
    "RunPayloads",
    "RunQuery",
    "RunState",
    "Schedule",
    "ScheduleInfo",
    "ScheduleNotFoundError",
    "Schedules",
    "SchemaNotMigratedError",
    "SchemaVersionError",
    "Settled",
    "SetupError",
    "Snooze",
    "StateError",
    "Step",
    "StreamItem",
    "SubmitConflictError",
    "SubmitOptions",
    "Throttle",
    "Throughput",
    "TrackedConnection",
    "TrackedTransaction",
    "Tx",
    "UnknownKindError",
    "UnknownNodeError",
    "UnknownQueueError",
    "UnservedWork",
    "UnsupportedLayoutError",
    "UnsupportedPoolerError",
    "Wakeups",
    "Worker",
    "WorkerInfo",
    "Workflow",
    "action",
    "batch_action",
    "batch_step",
    "define",
    "define_result",
    "enqueue",
    "enqueue_completion",
    "enqueue_many",
    "enqueue_many_tx",
    "enqueue_tx",
    "exponential_backoff",
    "register_kind",
    "schedule",
    "step",
    "submit_completion",
    "submit_tx",
    "track_wakeups",
]


async def enqueue(
    client: Client, kind: Kind[In, Out], input: In, **options: Unpack[EnqueueOptions]
) -> ResultRun[Out]:
    """Enqueue one job of ``kind``; the same as ``kind.enqueue(client, input, ...)``."""
    steps.require_kind(kind, call="enqueue")
    return await kind.enqueue(client, input, **options)


async def enqueue_tx(
    client: Client, tx: Tx, kind: Kind[In, Out], input: In, **options: Unpack[EnqueueOptions]
) -> ResultRun[Out]:
    """Enqueue one job in the caller's transaction; the same as ``kind.enqueue_tx``."""
    steps.require_kind(kind, call="enqueue_tx")
    return await kind.enqueue_tx(client, tx, input, **options)


async def enqueue_many(
    client: Client,
    kind: Kind[In, Out],
    inputs: Sequence[In],
    **options: Unpack[EnqueueManyOptions],
) -> list[ResultRun[Out]]:
    """Enqueue many jobs in one round trip; the same as ``kind.enqueue_many``."""
    steps.require_kind(kind, call="enqueue_many")
    return await kind.enqueue_many(client, inputs, **options)


async def enqueue_many_tx(
    client: Client,
    tx: Tx,
    kind: Kind[In, Out],
    inputs: Sequence[In],
    **options: Unpack[EnqueueManyOptions],
) -> list[ResultRun[Out]]:
    """Enqueue many jobs in the caller's transaction; the same as ``kind.enqueue_many_tx``."""
    steps.require_kind(kind, call="enqueue_many_tx")
    return await kind.enqueue_many_tx(client, tx, inputs, **options)


@overload
async def submit_tx(
    client: Client,
    tx: Tx,
    workflow: ResultWorkflow[In, Out],
    input: In,
    **options: Unpack[SubmitOptions],
) -> ResultRun[Out]: ...
@overload
async def submit_tx(
    client: Client, tx: Tx, workflow: Workflow[In], input: In, **options: Unpack[SubmitOptions]
) -> Run: ...
async def submit_tx(
    client: Client, tx: Tx, workflow: Workflow[In], input: In, **options: Unpack[SubmitOptions]
) -> Run:
    """Submit a workflow run in the caller's transaction; the same as ``workflow.submit_tx``.

    A :class:`ResultWorkflow` gives a :class:`ResultRun`.
    """
    _workflows.require_workflow(workflow, call="submit_tx")
    return await workflow.submit_tx(client, tx, input, **options)


async def enqueue_completion(
    ctx: Context | BatchContext,
    client: Client,
    kind: Kind[In, Out],
    input: In,
    **options: Unpack[EnqueueOptions],
) -> ResultRun[Out]:
    """Enqueue a job in the handler's completion transaction (a batch handler's too).

    The job exists only if this step's completion commits. ``client`` may be a producer-only
    client that declares ``kind`` with ``register_kind``; the row goes to the worker's database.
    """
    steps.require_kind(kind, call="enqueue_completion")
    tx = await ctx.completion_tracked()
    # Straight into the insert path: a unit test's context may have a recorder and no client.
    runs = await _inserter(client).enqueue(tx, kind, [input], options)
    return runs[0]


def _inserter(client: Client | None) -> _ports.Inserter:
    """The insert path of ``client``; without one, the path that only writes to a recorder
    (a unit test's context)."""
    return _insert.Inserter(None) if client is None else client.services.inserter


@overload
async def submit_completion(
    ctx: Context | BatchContext,
    client: Client,
    workflow: ResultWorkflow[In, Out],
    input: In,
    **options: Unpack[SubmitOptions],
) -> ResultRun[Out]: ...
@overload
async def submit_completion(
    ctx: Context | BatchContext,
    client: Client,
    workflow: Workflow[In],
    input: In,
    **options: Unpack[SubmitOptions],
) -> Run: ...
async def submit_completion(
    ctx: Context | BatchContext,
    client: Client,
    workflow: Workflow[In],
    input: In,
    **options: Unpack[SubmitOptions],
) -> Run:
    """Submit a workflow run in the handler's completion transaction.

    A :class:`ResultWorkflow` gives a :class:`ResultRun`.
    """
    _workflows.require_workflow(workflow, call="submit_completion")
    tx = await ctx.completion_tracked()
    run, _ = await _inserter(client).submit(tx, workflow, None, input, options)
    return run


if not TYPE_CHECKING:  # hidden from type checkers, which see `import cyclone.sync` itself

    def __getattr__(name: str) -> object:
        # cyclone.sync (on psycopg, an optional extra) loads on first use, so that
        # `import cyclone` needs no psycopg and `cyclone.sync.Client` works after it.
        if name == "sync":
            import importlib

            return importlib.import_module("cyclone.sync")
        raise AttributeError(f"module 'cyclone' has no attribute {name!r}")


def _own_module() -> None:
    # Public classes and functions report `cyclone.X`, not the private module they live in.
    for name in __all__:
        obj = globals()[name]
        if isinstance(obj, type) or inspect.isfunction(obj):
            obj.__module__ = __name__


_own_module()
