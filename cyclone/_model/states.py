"""Cyclone's state machine: the states of each table, and every transition between them.

Three tables carry a ``state`` column, each with a vocabulary of its own (the migrations'
CHECK constraints):

- ``cyclone_runs``: a run's stored :class:`RunState` (pending, completed, failed, cancelled,
  expired; ``RUNNING`` is only ever reported, never stored).
- ``cyclone_steps``: a workflow node's :class:`NodeState` (the table keeps its old name; a
  standalone job has no row there: its run row carries its one node).
- ``cyclone_tasks``: a live task's :class:`TaskState`. A task row exists only while its
  node or job has work to do: it is inserted when work is released and deleted when it ends.

A fourth vocabulary, :class:`ReportedNodeState`, is what ``run.info()`` reports for a node:
the node's stored state, with a queued node's live task telling available, scheduled or
running, and a waiting sleep node reported as sleeping. :data:`TRANSITIONS` lists every
write of a state column (an insert is a transition from nothing, a delete one to nothing),
the named statement in ``sql/`` that makes it, the condition under which the statement makes
it, and who calls that statement; ``tests/unit/test_states.py`` checks it against the SQL,
and docs/architecture.md shows it.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from cyclone._model.handles import RunState

__all__ = [
    "STATES",
    "STORED_RUN_STATES",
    "TRANSITIONS",
    "NodeState",
    "ReportedNodeState",
    "RunState",
    "Table",
    "TaskState",
    "Transition",
]


class Table(enum.StrEnum):
    """The tables whose rows have a state."""

    RUNS = "cyclone_runs"
    NODES = "cyclone_steps"
    TASKS = "cyclone_tasks"


class NodeState(enum.StrEnum):
    """A workflow node's stored state (``cyclone_steps.state``)."""

    PENDING = "pending"  # dependencies not done, or parked while its run is not pending
    QUEUED = "queued"  # released: it has a task row
    WAITING = "waiting"  # a reachable wait node without its signal, a map node's items run
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"
    SKIPPED = "skipped"  # never run: a branch before it was not taken


class TaskState(enum.StrEnum):
    """A task's state (``cyclone_tasks.state``); a task that ends is deleted."""

    AVAILABLE = "available"  # claimable from its available_at
    RUNNING = "running"  # claimed: leased by one attempt (lease_until is set)
    FAILED = "failed"  # a sequenced job out of attempts, kept to block its sequence


class ReportedNodeState(enum.StrEnum):
    """A node's state as ``run.info()`` reports it (:attr:`cyclone.NodeInfo.state`)."""

    PENDING = "pending"
    AVAILABLE = "available"
    SCHEDULED = "scheduled"  # available later: a retry's delay, or a run_at in the future
    RUNNING = "running"
    WAITING = "waiting"
    SLEEPING = "sleeping"  # a sleep node until its wake time (``NodeInfo.wake_at``)
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"
    SKIPPED = "skipped"
    EXPIRED = "expired"  # a job's, when it was not started by its expiry


STORED_RUN_STATES = frozenset(RunState) - {RunState.RUNNING}
"""The states a run row can hold; a pending run that started is reported as running."""

STATES: dict[Table, frozenset[str]] = {
    Table.RUNS: frozenset(STORED_RUN_STATES),
    Table.NODES: frozenset(NodeState),
    Table.TASKS: frozenset(TaskState),
}
"""Each table's vocabulary, as its CHECK constraint allows."""


@dataclass(frozen=True, slots=True)
class Transition:
    """One state change a named statement makes to rows of one table.

    ``source`` is empty when the statement inserts the row; ``target`` is ``None`` when it
    deletes the row.
    """

    table: Table
    source: frozenset[str]
    target: str | None
    statement: str
    guard: str
    caller: str


def _t(
    table: Table,
    source: str | tuple[str, ...],
    target: str | None,
    statements: str,
    guard: str,
    caller: str,
) -> list[Transition]:
    # One row of the table per statement (several share one transition).
    sources = frozenset((source,) if isinstance(source, str) else source)
    return [Transition(table, sources, target, s, guard, caller) for s in statements.split()]


_NEW = ()  # the statement inserts the row
_GONE = None  # the statement deletes the row

R, N, T = RunState, NodeState, TaskState
_ENDED = (R.COMPLETED, R.FAILED, R.CANCELLED, R.EXPIRED)
_LIVE_TASK = (T.AVAILABLE, T.RUNNING, T.FAILED)
_ENQUEUE = "job_insert_many"
_UNIQUE = "job_insert_unique"
_SUBMIT = "workflow_insert workflow_insert_static child_insert_many"
_SUBMITTERS = "submit, completer (child runs)"
_FENCED = "the task is still running under the attempt's claim count"

# fmt: off
TRANSITIONS: tuple[Transition, ...] = (
    # Runs.
    *_t(Table.RUNS, _NEW, R.PENDING, _ENQUEUE, "none", "enqueue, enqueue_many"),
    *_t(Table.RUNS, _NEW, R.PENDING, _UNIQUE, "no pending run holds the unique key",
        "enqueue(unique=...)"),
    *_t(Table.RUNS, _NEW, R.PENDING, "job_debounce",
        "no never-claimed task of the kind holds the debounce key", "enqueue(debounce=...)"),
    *_t(Table.RUNS, _NEW, R.PENDING, "job_throttle",
        "no run of the kind took the throttle key within its period", "enqueue(throttle=...)"),
    *_t(Table.RUNS, _NEW, R.PENDING, _SUBMIT, "the submit key, if any, is free",
        "submit, submit_once, completer (child runs)"),
    *_t(Table.RUNS, _NEW, R.PENDING, "run_fork", "the fork key, if any, is free", "fork"),
    *_t(Table.RUNS, _NEW, R.PENDING, "schedule_job_insert_many", "the slot's key is free",
        "scheduler"),
    *_t(Table.RUNS, R.PENDING, R.COMPLETED, "job_complete_many", f"{_FENCED}; run pending",
        "completer"),
    *_t(Table.RUNS, R.PENDING, _GONE, "job_discard_many",
        f"its kind keeps nothing once completed; {_FENCED}; run pending", "completer"),
    *_t(Table.RUNS, R.PENDING, R.EXPIRED, "job_expire",
        "its task, available and never started, is past its expiry (locked, SKIP LOCKED)",
        "maintenance (expiry)"),
    *_t(Table.RUNS, R.PENDING, R.COMPLETED, "node_advance",
        "run pending (locked); its last remaining node completed", "completer, signal, retry"),
    *_t(Table.RUNS, R.PENDING, R.FAILED, "job_fail",
        f"last attempt; {_FENCED} (maintenance: and its lease expired)",
        "completer, maintenance"),
    *_t(Table.RUNS, R.PENDING, R.FAILED, "run_fail", "run pending (locked)",
        "completer, maintenance (node out of attempts, wait timeout, deadline)"),
    *_t(Table.RUNS, R.PENDING, R.FAILED, "job_end", "run pending, past its deadline (locked)",
        "maintenance (deadline)"),
    *_t(Table.RUNS, (R.PENDING, R.FAILED), R.CANCELLED, "job_end run_cancel",
        "run pending or failed (locked)", "cancel"),
    *_t(Table.RUNS, R.FAILED, R.PENDING, "run_reopen",
        "run failed (locked); no failed node left after the reset", "retry"),
    *_t(Table.RUNS, R.FAILED, R.PENDING, "job_reopen", "run failed (locked)", "retry"),
    *_t(Table.RUNS, _ENDED, _GONE, "run_purge",
        "ended before the cut-off, in the states asked; no task left but available ones; "
        "not locked by another (SKIP LOCKED)", "purge, retention"),
    # Workflow nodes.
    *_t(Table.NODES, _NEW, N.PENDING, _SUBMIT, "the node has dependencies", _SUBMITTERS),
    *_t(Table.NODES, _NEW, N.QUEUED, _SUBMIT, "a root step (it gets its task)", _SUBMITTERS),
    *_t(Table.NODES, _NEW, N.WAITING, _SUBMIT, "a root wait node or map node", _SUBMITTERS),
    *_t(Table.NODES, _NEW, N.PENDING, "run_fork",
        "re-run: the fork node, what comes after it, and nodes without an output to copy",
        "fork"),
    *_t(Table.NODES, _NEW, N.COMPLETED, "run_fork",
        "copied: completed in the run forked (with its output), or an item of a copied map node",
        "fork"),
    *_t(Table.NODES, _NEW, N.SKIPPED, "run_fork", "copied: skipped in the run forked", "fork"),
    *_t(Table.NODES, _NEW, N.FAILED, "run_fork",
        "copied: an item of a copied settling map node that failed", "fork"),
    *_t(Table.NODES, N.PENDING, N.QUEUED, "node_advance run_release",
        "a step with no dependency left, its join satisfied; run pending (locked)",
        "completer, signal, retry"),
    *_t(Table.NODES, N.PENDING, N.WAITING, "node_advance run_release",
        "a wait node or map node with no dependency left, its join satisfied; run pending "
        "(locked)", "completer, signal, retry"),
    *_t(Table.NODES, N.PENDING, N.SKIPPED, "node_advance run_release",
        "no dependency left, its join not satisfied (all: a branch to it not taken or a "
        "parent skipped; any: none taken); run pending (locked)", "completer, signal, retry"),
    *_t(Table.NODES, _NEW, N.QUEUED, "map_expand",
        "an item node of a reached map node, among the first max_parallel; run pending",
        "completer, signal, retry, submit"),
    *_t(Table.NODES, _NEW, N.PENDING, "map_expand",
        "an item node past the first max_parallel, or its run not pending",
        "completer, signal, retry, submit"),
    *_t(Table.NODES, N.WAITING, N.COMPLETED, "map_expand",
        "a map node not expanded yet, over an empty list", "completer, signal, retry, submit"),
    *_t(Table.NODES, N.WAITING, N.FAILED, "map_expand",
        "a map node not expanded yet, over more than max_items or a value that is no list",
        "completer, signal, retry, submit"),
    *_t(Table.NODES, N.PENDING, N.QUEUED, "map_settle",
        "the next item nodes, one per item settled; run pending", "completer, maintenance"),
    *_t(Table.NODES, N.PENDING, N.PENDING, "map_settle",
        "the next item nodes, one per item settled, parked (no dependency left): run not "
        "pending", "completer, maintenance"),
    *_t(Table.NODES, N.WAITING, N.COMPLETED, "map_settle",
        "a map node whose last item settled (completed, or failed in a settling map)",
        "completer, maintenance"),
    *_t(Table.NODES, N.QUEUED, N.COMPLETED, "node_complete_many", _FENCED, "completer"),
    *_t(Table.NODES, N.QUEUED, N.WAITING, "node_complete_many",
        f"a child node, whose attempt submitted its child run, or a sleep node, asleep until "
        f"the wake time its attempt gave; {_FENCED}", "completer"),
    *_t(Table.NODES, N.WAITING, N.COMPLETED, "sleep_wake_many",
        "a sleep node whose wake time has come (runs locked)", "completer, maintenance"),
    *_t(Table.NODES, N.WAITING, N.COMPLETED, "child_settle",
        "a child node whose child run completed (runs locked)",
        "completer, maintenance, cancel, signal, retry"),
    *_t(Table.NODES, N.WAITING, N.QUEUED, "child_settle",
        "a child node whose child run failed or was cancelled, attempts left, run pending "
        "(runs locked)", "completer, maintenance, cancel, signal, retry"),
    *_t(Table.NODES, N.WAITING, N.FAILED, "child_settle",
        "a child node whose child run failed or was cancelled: out of attempts, or its run "
        "not pending (runs locked)", "completer, maintenance, cancel, signal, retry"),
    *_t(Table.NODES, N.WAITING, N.COMPLETED, "wait_complete_many",
        "its signal is stored (every one of its events, for a wait_all node)",
        "completer, signal, retry"),
    *_t(Table.NODES, N.QUEUED, N.FAILED, "node_fail",
        f"last attempt; {_FENCED} (maintenance: and its lease expired)",
        "completer, maintenance"),
    *_t(Table.NODES, N.WAITING, N.FAILED, "wait_expire", "its timeout passed", "maintenance"),
    *_t(Table.NODES, N.WAITING, N.COMPLETED, "wait_expire",
        "its timeout passed and it has on_timeout", "maintenance"),
    *_t(Table.NODES, N.QUEUED, N.PENDING, "task_retry_many",
        f"parked: {_FENCED}; its run is no longer pending", "completer (retry, snooze)"),
    *_t(Table.NODES, N.QUEUED, N.PENDING, "task_reclaim task_rescue",
        "parked: lease expired or worker lost, attempts left; its run is no longer pending",
        "maintenance"),
    *_t(Table.NODES, (N.QUEUED, N.WAITING), N.PENDING, "run_fail",
        "parked: its task was dropped (available, or running with drop_running), or a "
        "waiting wait node", "completer, maintenance"),
    *_t(Table.NODES, (N.PENDING, N.QUEUED, N.WAITING), N.CANCELLED, "run_cancel",
        "not completed, failed or skipped; its run cancelled by this statement", "cancel"),
    *_t(Table.NODES, N.FAILED, N.PENDING, "run_reopen",
        "failed (only the named node, when given); run failed (locked)", "retry"),
    *_t(Table.NODES, tuple(N), _GONE, "run_purge", "its run is purged", "purge, retention"),
    # Tasks.
    *_t(Table.TASKS, _NEW, T.AVAILABLE, f"{_ENQUEUE} {_UNIQUE} schedule_job_insert_many",
        "with its run (none when the run's insert did nothing)", "enqueue, scheduler"),
    *_t(Table.TASKS, _NEW, T.AVAILABLE, "job_debounce job_throttle",
        "with its run (none when the key sent the call to an existing run)",
        "enqueue(debounce=..., throttle=...)"),
    *_t(Table.TASKS, _NEW, T.AVAILABLE, _SUBMIT, "a root step", _SUBMITTERS),
    *_t(Table.TASKS, _NEW, T.AVAILABLE, "node_advance run_release",
        "a step released (pending to queued)", "completer, signal, retry"),
    *_t(Table.TASKS, _NEW, T.AVAILABLE, "map_expand map_settle",
        "an item node queued", "completer, maintenance, signal, retry, submit"),
    *_t(Table.TASKS, _NEW, T.AVAILABLE, "child_settle",
        "a child node queued again: a new attempt submits a new child",
        "completer, maintenance, cancel, signal, retry"),
    *_t(Table.TASKS, _NEW, T.AVAILABLE, "job_reopen", "the failed job kept no task", "retry"),
    *_t(Table.TASKS, T.FAILED, T.AVAILABLE, "job_reopen",
        "the failed sequenced job's blocking task", "retry"),
    *_t(Table.TASKS, T.AVAILABLE, T.RUNNING, "task_claim task_claim_plain",
        "due, not expired, kind (and workflow) served, run pending, first live task of its "
        "sequence, room under flow control; not locked by another (SKIP LOCKED)", "producer"),
    *_t(Table.TASKS, T.RUNNING, T.AVAILABLE, "task_retry_many", f"{_FENCED}; run pending",
        "completer (retry, snooze)"),
    *_t(Table.TASKS, T.RUNNING, T.AVAILABLE, "task_reclaim task_rescue",
        "lease expired, or its worker's liveness session ended; attempts left; run pending",
        "maintenance"),
    *_t(Table.TASKS, T.RUNNING, T.FAILED, "job_fail",
        f"a sequenced job's last attempt; {_FENCED}", "completer, maintenance"),
    *_t(Table.TASKS, (T.AVAILABLE, T.RUNNING), T.FAILED, "job_end",
        "a sequenced job past its deadline", "maintenance (deadline)"),
    *_t(Table.TASKS, T.AVAILABLE, _GONE, "job_expire",
        "a job's task never started, past its expiry; not locked by another (SKIP LOCKED)",
        "maintenance (expiry)"),
    *_t(Table.TASKS, T.RUNNING, _GONE, "job_complete_many job_discard_many node_complete_many",
        _FENCED,
        "completer"),
    *_t(Table.TASKS, T.RUNNING, _GONE, "task_retry_many task_reclaim task_rescue",
        "as to available, but its run is no longer pending (parked)",
        "completer, maintenance"),
    *_t(Table.TASKS, T.RUNNING, _GONE, "job_fail node_fail",
        f"last attempt, not a sequenced job; {_FENCED}", "completer, maintenance"),
    *_t(Table.TASKS, (T.AVAILABLE, T.RUNNING), _GONE, "run_fail",
        "its run failed by this statement; running only with drop_running",
        "completer, maintenance"),
    *_t(Table.TASKS, _LIVE_TASK, _GONE, "job_end run_cancel",
        "cancel: every task of the run; deadline: an unsequenced job's task",
        "cancel, maintenance (deadline)"),
    *_t(Table.TASKS, T.AVAILABLE, _GONE, "run_purge", "its run is purged", "purge, retention"),
)
"""Every state transition, grouped by table; see the module's docstring."""
# fmt: on
