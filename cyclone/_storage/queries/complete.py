"""The outcomes of attempts (``sql/complete.sql``): completions, retries and last failures,
each fenced by the attempt's claim, and the checks of whether a write whose reply was lost
committed."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass

from cyclone._storage.loader import Queries
from cyclone._storage.queries.conn import Conn, Record, fetch, fetchval


@dataclass(frozen=True)
class Completions:
    """The attempts a completion statement completes, one array each: their runs, task ids,
    claim tokens (the fence) and outputs as JSON text."""

    run_ids: Sequence[uuid.UUID]
    ids: Sequence[int]
    claims: Sequence[int]
    outputs: Sequence[str]


async def job_complete_many(conn: Conn, q: Queries, done: Completions) -> list[Record]:
    """Complete jobs whose attempts still own their tasks; return (id, run_id) of those."""
    return await fetch(conn, q, "job_complete_many", **vars(done))


async def node_complete_many(conn: Conn, q: Queries, done: Completions) -> list[Record]:
    """Record completed workflow nodes whose attempts still own their tasks."""
    return await fetch(conn, q, "node_complete_many", **vars(done))


async def attempts_completed(
    conn: Conn,
    q: Queries,
    run_ids: Sequence[uuid.UUID],
    nodes: Sequence[str | None],
    task_ids: Sequence[int],
    claims: Sequence[int],
) -> set[tuple[uuid.UUID, str | None]]:
    """The (run, node) of those attempts that completed their job or node."""
    rows = await fetch(
        conn,
        q,
        "attempts_completed",
        run_ids=run_ids,
        nodes=nodes,
        task_ids=task_ids,
        claims=claims,
    )
    return {(r["run_id"], r["node"]) for r in rows}


async def task_retry_many(
    conn: Conn,
    q: Queries,
    run_ids: Sequence[uuid.UUID],
    ids: Sequence[int],
    claims: Sequence[int],
    delays: Sequence[float],
    errors: Sequence[str | None],
    refunds: Sequence[bool],
) -> list[Record]:
    """Put attempts back to available after a delay; return (id, queue) of those owned."""
    return await fetch(
        conn,
        q,
        "task_retry_many",
        run_ids=run_ids,
        ids=ids,
        claims=claims,
        delays=delays,
        errors=errors,
        refunds=refunds,
    )


async def job_fail(
    conn: Conn,
    q: Queries,
    run_id: uuid.UUID,
    task_id: int,
    claims: int,
    error: str,
    *,
    expired_only: bool,
) -> bool:
    """Fail a job's last attempt; whether its run failed by this call."""
    row = await fetchval(
        conn,
        q,
        "job_fail",
        run_id=run_id,
        task_id=task_id,
        claims=claims,
        error=error,
        expired_only=expired_only,
    )
    return row is not None


async def node_fail(
    conn: Conn,
    q: Queries,
    run_id: uuid.UUID,
    task_id: int,
    claims: int,
    error: str,
    *,
    expired_only: bool,
) -> bool:
    """Fail a workflow node's last attempt; whether the attempt still owned its task."""
    row = await fetchval(
        conn,
        q,
        "node_fail",
        run_id=run_id,
        task_id=task_id,
        claims=claims,
        error=error,
        expired_only=expired_only,
    )
    return row is not None


async def attempts_released(
    conn: Conn,
    q: Queries,
    run_ids: Sequence[uuid.UUID],
    task_ids: Sequence[int],
    claims: Sequence[int],
    attempts: Sequence[int],
) -> set[tuple[int, int]]:
    """The (task, claims) of those attempts that put their task back in its queue."""
    rows = await fetch(
        conn,
        q,
        "attempts_released",
        run_ids=run_ids,
        task_ids=task_ids,
        claims=claims,
        attempts=attempts,
    )
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
