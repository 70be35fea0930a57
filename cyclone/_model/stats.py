"""The read models of queues and workers that the client returns: a queue's live work
(:class:`QueueStats`), the work no live worker serves, the live workers, and a queue's
throughput by the minute."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class UnservedWork:
    """Claimable tasks of one kind (and workflow, for nodes) that no live worker serves."""

    kind: str
    workflow: str | None  # None: standalone jobs
    count: int


@dataclass(frozen=True, slots=True)
class WorkerInfo:
    """A live worker: where it runs, what it claims, when it started and last renewed its
    presence (once per heartbeat). A worker that stopped renewing for a few heartbeats is no
    longer listed."""

    id: str
    host: str
    pid: int
    queues: list[str]
    kinds: list[str]
    workflows: list[str]
    started_at: dt.datetime
    seen_at: dt.datetime


@dataclass(frozen=True, slots=True)
class QueueStats:
    """One queue's live work: tasks by state, the oldest wait, the last minute's throughput.

    ``expired`` counts running tasks whose lease ran out (their worker is gone or stalled);
    ``blocking`` counts failed sequenced jobs holding up their sequence. ``workers`` counts
    the live workers claiming from the queue; ``unserved`` the claimable tasks that none of
    them serves (kind or workflow not given to any), detailed in ``unserved_work``.
    ``paused`` and the ``*_limit`` fields are the queue's flow control (docs/flow-control.md):
    ``rate_limit`` and ``key_rate_limit`` (each group key's) are (starts, per seconds);
    ``None`` is no limit.
    """

    queue: str
    available: int
    scheduled: int
    running: int
    expired: int
    blocking: int
    oldest_seconds: float | None
    completed_last_minute: int
    workers: int = 0
    unserved: int = 0
    unserved_work: list[UnservedWork] = field(default_factory=list)
    paused: bool = False
    concurrency_limit: int | None = None
    rate_limit: tuple[int, float] | None = None
    key_concurrency_limit: int | None = None
    key_rate_limit: tuple[int, float] | None = None


@dataclass(frozen=True, slots=True)
class Throughput:
    """Jobs and workflow nodes of one queue that ended in one minute (``minute`` is its start,
    UTC): completed, and failed with their attempts used up."""

    queue: str
    minute: dt.datetime
    completed: int
    failed: int
