"""Why a run is not running: the read model of ``client.explain(run)`` (pure).

An :class:`Explanation` gives one :class:`Reason` per node of a pending run that is not done
(a job has one node, named after its kind), or one reason with no node for a run that has
ended. Each reason has a code from the closed set :class:`ReasonCode`, a sentence saying
what goes on and what to do, and the facts it was told from.
"""

from __future__ import annotations

import datetime as dt
import enum
import uuid
from dataclasses import dataclass
from typing import Literal

from cyclone._model.handles import RunState
from cyclone._model.stats import WorkerInfo


class ReasonCode(enum.StrEnum):
    """Why a node is not running, or that it runs, or how its run ended.

    A claimable node gets the first of these that holds, in this order: ``SEQUENCE_BLOCKED``,
    ``QUEUE_PAUSED``, ``NO_WORKER``, ``CONCURRENCY_LIMIT``, ``RATE_LIMIT``,
    ``BEHIND_OTHERS``, ``READY``. A running one: ``LEASE_EXPIRED``, ``RUNNING_WORKER_LOST``,
    ``RUNNING_ALIVE``.
    """

    SCHEDULED = "scheduled"
    """Not due yet: scheduled (``process_in``, ``process_at``), backing off after a failed
    attempt, or snoozed; ``until`` is when it is due."""
    QUEUE_PAUSED = "queue_paused"
    """Its queue is paused: nothing of it starts until ``client.queues.resume(queue)``."""
    NO_WORKER = "no_worker"
    """Claimable, but no live worker claims from its queue and runs its kind (and, for a
    node, knows its workflow)."""
    CONCURRENCY_LIMIT = "concurrency_limit"
    """A concurrency limit (``limit``) is full: ``held_by`` are runs holding its slots."""
    RATE_LIMIT = "rate_limit"
    """A rate limit (``limit``) has no start left in its period; ``until`` is when it has."""
    BEHIND_OTHERS = "behind_others"
    """Claimable and served, but ``ahead`` tasks of its queue (of its group key, for keyed
    work: keys take turns) are claimed before it."""
    READY = "ready"
    """Claimable now, first in line, and a live worker serves it: it starts within a poll."""
    WAITING_ON_PARENTS = "waiting_on_parents"
    """A workflow node whose dependencies (``parents``) are not done."""
    WAITING_FOR_SIGNAL = "waiting_for_signal"
    """A wait node waiting, ``since`` then, for ``client.signal(run_id, node, payload)``;
    ``until`` is its timeout."""
    SLEEPING = "sleeping"
    """A sleep node sleeping until ``until``, its wake time; it holds no worker slot."""
    WAITING_ON_CHILD_RUN = "waiting_on_child_run"
    """A child node whose child run (``child_run``) has not ended."""
    WAITING_ON_ITEMS = "waiting_on_items"
    """A map node whose items (``items_left`` of them) are not all done."""
    SEQUENCE_BLOCKED = "sequence_blocked"
    """A sequenced job behind an earlier job of its sequence (``held_by``) that is live."""
    RUNNING_ALIVE = "running_alive"
    """Running on a live worker (``worker``, ``presence``), leased ``until``."""
    RUNNING_WORKER_LOST = "running_worker_lost"
    """Claimed by a worker that is gone (its liveness lock free, or its presence row gone or
    expired); its task is released ``until`` then."""
    LEASE_EXPIRED = "lease_expired"
    """Claimed, and its lease ran out ``since`` then: the next maintenance pass takes it
    back (or fails it, on its last attempt)."""
    COMPLETED = "completed"
    """The run completed."""
    FAILED = "failed"
    """The run failed; ``run.retry_all()`` re-opens it."""
    CANCELLED = "cancelled"
    """The run was cancelled."""
    EXPIRED = "expired"
    """The job was not started by its expiry, and never ran; enqueue it again to run it."""


@dataclass(frozen=True, slots=True)
class LimitReached:
    """A flow-control limit that holds a node back (docs/flow-control.md).

    ``scope`` says whose limit it is: a queue's, a kind's, or a queue's limit per group key;
    ``name`` is that queue, kind or group key. ``limit`` is the most running at once, or, for
    a rate, the starts allowed per ``per`` seconds (``None`` for a concurrency limit).
    """

    scope: Literal["queue", "kind", "group"]
    name: str
    limit: int
    per: float | None = None


@dataclass(frozen=True, slots=True)
class Reason:
    """Why one node is not running, or where it runs; ``node`` is ``None`` for a run that
    has ended.

    ``message`` says it in words, with what to do. The other fields are the facts behind it,
    each set where its code gives it a meaning (see :class:`ReasonCode`): ``since`` and
    ``until`` bound the state (``until``: when it is expected to change, if known), ``queue``
    is the node's queue, ``held_by`` the runs holding a full limit's slots (the first ten) or
    the sequence's earlier run, ``worker`` the id of the worker that claimed the node and
    ``presence`` its row of live workers (``seen_at``: its last heartbeat; ``None`` once the
    row is gone).
    """

    node: str | None
    code: ReasonCode
    message: str
    queue: str | None = None
    since: dt.datetime | None = None
    until: dt.datetime | None = None
    parents: tuple[str, ...] = ()
    child_run: uuid.UUID | None = None
    items_left: int | None = None
    limit: LimitReached | None = None
    held_by: tuple[uuid.UUID, ...] = ()
    ahead: int | None = None
    worker: str | None = None
    presence: WorkerInfo | None = None


@dataclass(frozen=True, slots=True)
class Explanation:
    """Where run ``run_id`` stands and why: its ``state`` and one :class:`Reason` per node
    that is not done, in the order of ``run.info()``'s nodes (one reason with no node for a
    run that has ended). A run with more open nodes than are explained at once (a large map)
    has the rest counted in ``omitted``. ``summary`` is the reasons in words, a line each.
    """

    run_id: uuid.UUID
    state: RunState
    reasons: tuple[Reason, ...]
    omitted: int = 0

    @property
    def summary(self) -> str:
        """One line per reason, ``node: message``, and a last one for the omitted nodes."""
        lines = [r.message if r.node is None else f"{r.node}: {r.message}" for r in self.reasons]
        if self.omitted:
            lines.append(f"... and {self.omitted} more open nodes")
        return "\n".join(lines)
