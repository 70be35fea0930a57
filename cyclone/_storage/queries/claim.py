"""Claiming work and keeping it (``sql/claim.sql``)."""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

from cyclone._storage.loader import Queries
from cyclone._storage.queries.conn import Conn, Record, fetch, fetchval

CLAIM_MAX = 1000
"""Most tasks one claim statement takes: the constant LIMIT in ``task_claim`` and
``task_claim_plain`` (sql/claim.sql), which keeps the planner's estimate of the claim
independent of the backlog."""


@dataclass(frozen=True)
class ClaimRequest:
    """What a claim statement is asked for: up to ``limit`` available tasks of ``queue`` whose
    kind is one of ``kinds`` (a workflow's node only if the workflow is one of ``workflows``),
    leased for ``lease`` seconds to ``worker``."""

    queue: str
    kinds: Sequence[str]
    limit: int
    lease: float
    worker: str
    workflows: Sequence[str]


class Owned(Protocol):
    """An attempt as a fenced statement names it: its run, its task, and the claim token
    that started it (the task's ``claims`` then)."""

    @property
    def run_id(self) -> uuid.UUID: ...
    @property
    def id(self) -> int: ...
    @property
    def claims(self) -> int: ...


@dataclass(frozen=True)
class Fence:
    """The attempts a fenced statement acts on, one array each: their runs, task ids and
    claim tokens. A statement changes a task only while its ``claims`` is still the token
    given: an attempt that lost its task changes nothing."""

    run_ids: Sequence[uuid.UUID]
    ids: Sequence[int]
    claims: Sequence[int]

    @classmethod
    def of(cls, attempts: Iterable[Owned]) -> Fence:
        """The fence of ``attempts``, in their order."""
        owned = list(attempts)
        return cls([a.run_id for a in owned], [a.id for a in owned], [a.claims for a in owned])


@dataclass(frozen=True)
class TaskAttempt:
    """An attempt that a row names by its ``run_id``, ``node``, ``id`` and ``claims``."""

    run_id: uuid.UUID
    node: str | None
    id: int
    claims: int

    @classmethod
    def of(cls, row: Record) -> TaskAttempt:
        """The attempt ``row`` names."""
        return cls(run_id=row["run_id"], node=row["node"], id=row["id"], claims=row["claims"])


class ClaimedRows(list[Record]):
    """The tasks a claim took, and whether a limit held it back (``held``). If so,
    ``retry_in`` is how many seconds until a claim can start more: 0 at once, ``None`` when
    a running task of the queue (or kind) ends."""

    held: bool = False
    retry_in: float | None = None
    # From task_claim: the queue used no flow control in its snapshot, so the plain claim
    # would have done.
    plain: bool = False
    # From task_claim_plain: the queue uses flow control, so nothing was claimed and the
    # claim is task_claim's to make.
    declined: bool = False


async def task_claim(conn: Conn, q: Queries, request: ClaimRequest) -> ClaimedRows:
    """Claim up to ``request.limit`` available tasks, within the queue's flow control.

    The rows are the claimed tasks; when a limit held the claim back, ``retry_in`` on the
    result says when to claim again, and ``plain`` whether the queue uses no flow control at
    all (see ClaimedRows).
    """
    rows = await fetch(conn, q, "task_claim", **vars(request))
    claimed = ClaimedRows(r for r in rows if r["id"] is not None)
    for r in rows:
        if r["id"] is None and r["plain"]:  # the statement's last row: no flow control
            claimed.plain = True
        elif r["id"] is None:  # or: a limit held the claim back
            claimed.held, claimed.retry_in = True, r["retry_in"]
    return claimed


async def task_claim_plain(conn: Conn, q: Queries, request: ClaimRequest) -> ClaimedRows:
    """Claim as :func:`task_claim` does, more cheaply, if the queue uses no flow control
    (not paused, no limit on it or on one of the kinds, no keyed work available); if it does,
    claim nothing and return rows that are ``declined``."""
    rows = await fetch(conn, q, "task_claim_plain", **vars(request))
    claimed = ClaimedRows(r for r in rows if r["id"] is not None)
    claimed.declined = len(claimed) < len(rows)  # the statement's one row with a NULL id
    return claimed


async def task_heartbeat(
    conn: Conn, q: Queries, fence: Fence, lease: float
) -> set[tuple[int, int]]:
    """Extend the leases of the fenced attempts; return the (id, claims) still owned."""
    rows = await fetch(conn, q, "task_heartbeat", **vars(fence), lease=lease)
    return {(r["id"], r["claims"]) for r in rows}


async def task_pending_work(
    conn: Conn, q: Queries, kinds: Sequence[str], workflows: Sequence[str]
) -> bool:
    """Whether a worker of ``kinds`` and ``workflows`` has work claimable now or running."""
    return bool(await fetchval(conn, q, "task_pending_work", kinds=kinds, workflows=workflows))
