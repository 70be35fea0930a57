"""The outcomes of attempts (``sql/complete.sql``): completions, retries and last failures,
each fenced by the attempt's claim, and the checks of whether a write whose reply was lost
committed."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from cyclone._storage.loader import Queries
from cyclone._storage.queries.claim import Fence, Owned
from cyclone._storage.queries.conn import Conn, Record, fetch, fetchrow


@dataclass(frozen=True)
class Completions:
    """The attempts a completion statement completes, and their outputs as JSON text, one
    each."""

    fence: Fence
    outputs: Sequence[str]


async def job_complete_many(conn: Conn, q: Queries, done: Completions) -> list[Record]:
    """Complete jobs whose attempts still own their tasks; return (id, run_id) of those."""
    return await fetch(conn, q, "job_complete_many", **vars(done.fence), outputs=done.outputs)


async def job_discard_many(conn: Conn, q: Queries, fence: Fence) -> list[Record]:
    """Complete jobs that keep nothing: delete their tasks and runs while their attempts
    still own the tasks; return (id, claims, run_id) of those."""
    return await fetch(conn, q, "job_discard_many", **vars(fence))


async def jobs_discarded(conn: Conn, q: Queries, run_ids: Sequence[uuid.UUID]) -> set[uuid.UUID]:
    """The runs among ``run_ids`` that are gone (a discard committed)."""
    rows = await fetch(conn, q, "jobs_discarded", run_ids=list(run_ids))
    return {r["run_id"] for r in rows}


async def node_complete_many(conn: Conn, q: Queries, done: Completions) -> list[Record]:
    """Record completed workflow nodes whose attempts still own their tasks."""
    return await fetch(conn, q, "node_complete_many", **vars(done.fence), outputs=done.outputs)


async def attempts_completed(
    conn: Conn, q: Queries, fence: Fence, nodes: Sequence[str | None]
) -> set[tuple[uuid.UUID, str | None]]:
    """The (run, node) of those fenced attempts (of ``nodes``) that completed their job or
    node."""
    rows = await fetch(conn, q, "attempts_completed", **vars(fence), nodes=nodes)
    return {(r["run_id"], r["node"]) for r in rows}


async def task_retry_many(
    conn: Conn,
    q: Queries,
    fence: Fence,
    delays: Sequence[float],
    errors: Sequence[str | None],
    refunds: Sequence[bool],
) -> list[Record]:
    """Put the fenced attempts' tasks back to available after a delay each; return (id,
    queue) of those owned."""
    args = {"delays": delays, "errors": errors, "refunds": refunds}
    return await fetch(conn, q, "task_retry_many", **vars(fence), **args)


class LastAttempt(Owned, Protocol):
    """An attempt that fails for good: the fenced attempt and the node it ran (None for a
    job)."""

    @property
    def node(self) -> str | None: ...


async def task_fail(
    conn: Conn, q: Queries, attempt: LastAttempt, error: str, *, expired_only: bool
) -> Record | None:
    """Fail a job's or a workflow node's last attempt, recording ``error``; with
    ``expired_only``, only while its lease is still expired. None when the attempt no longer
    owned its task (nothing was written).

    For a job (``job_fail``), its run, failed by this call; for a node (``node_fail``), the
    node, with ``settles``: it is an item of a map that settles all its items (the caller
    settles it there, or fails the run).
    """
    params = {
        "run_id": attempt.run_id,
        "task_id": attempt.id,
        "claims": attempt.claims,
        "error": error,
        "expired_only": expired_only,
    }
    if attempt.node is None:
        return await fetchrow(conn, q, "job_fail", **params)
    return await fetchrow(conn, q, "node_fail", **params)


async def attempts_released(
    conn: Conn, q: Queries, fence: Fence, attempts: Sequence[int]
) -> set[tuple[int, int]]:
    """The (task, claims) of those fenced attempts (numbered ``attempts``) that put their
    task back in its queue."""
    rows = await fetch(conn, q, "attempts_released", **vars(fence), attempts=attempts)
    return {(r["id"], r["claims"]) for r in rows}


async def attempts_failed(
    conn: Conn,
    q: Queries,
    run_ids: Sequence[uuid.UUID],
    nodes: Sequence[str | None],
    errors: Sequence[str],
) -> set[tuple[uuid.UUID, str | None]]:
    """The (run, node) of those attempts whose failure, with that error record, was kept."""
    rows = await fetch(conn, q, "attempts_failed", run_ids=run_ids, nodes=nodes, errors=errors)
    return {(r["run_id"], r["node"]) for r in rows}
