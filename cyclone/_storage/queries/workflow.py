"""Advancing workflow runs (``sql/workflow.sql``): the run lock, releasing children, map
nodes, failing and re-opening a run."""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Sequence

from cyclone._storage.loader import Queries
from cyclone._storage.queries.conn import Conn, Record, execute, fetch, fetchrow


async def run_lock_many(
    conn: Conn, q: Queries, run_ids: Sequence[uuid.UUID]
) -> dict[uuid.UUID, str]:
    """Lock runs in id order (the first lock of every multi-row transition)."""
    rows = await fetch(conn, q, "run_lock_many", run_ids=sorted(set(run_ids)))
    return {r["id"]: r["state"] for r in rows}


async def node_advance(
    conn: Conn,
    q: Queries,
    run_ids: Sequence[uuid.UUID],
    nodes: Sequence[str],
    skipped: Sequence[bool],
) -> list[Record]:
    """Release children of completed (or ``skipped``) nodes and count their runs down."""
    return await fetch(conn, q, "node_advance", run_ids=run_ids, nodes=nodes, skipped=skipped)


async def map_expand(
    conn: Conn,
    q: Queries,
    run_ids: Sequence[uuid.UUID],
    nodes: Sequence[str],
    available_at: dt.datetime | None = None,
) -> list[Record]:
    """Grow the item nodes of reached map nodes, their tasks claimable from
    ``available_at`` (None: now)."""
    return await fetch(
        conn, q, "map_expand", run_ids=run_ids, nodes=nodes, available_at=available_at
    )


async def map_settle(
    conn: Conn, q: Queries, run_ids: Sequence[uuid.UUID], nodes: Sequence[str]
) -> list[Record]:
    """Count settled item nodes down on their map nodes, releasing the next items."""
    return await fetch(conn, q, "map_settle", run_ids=run_ids, nodes=nodes)


async def run_release(conn: Conn, q: Queries, run_id: uuid.UUID) -> list[Record]:
    """Release the ready nodes of an open run: what each became (``what``)."""
    return await fetch(conn, q, "run_release", run_id=run_id)


async def run_fail(
    conn: Conn, q: Queries, run_id: uuid.UUID, error: str, *, drop_running: bool
) -> None:
    """Fail a pending run and drop the work it has not started (or all of it)."""
    await execute(conn, q, "run_fail", run_id=run_id, error=error, drop_running=drop_running)


async def run_reopen(conn: Conn, q: Queries, run_id: uuid.UUID, node: str | None) -> Record:
    """Reset a failed workflow run's failed nodes: how many, and whether the run re-opened."""
    row = await fetchrow(conn, q, "run_reopen", run_id=run_id, node=node)
    assert row is not None
    return row
