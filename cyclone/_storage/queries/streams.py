"""Progress and streams (``sql/streams.sql``): appending to a run's stream, reporting a
node's progress, and reading both. Each write is a statement of its own, outside any
completion transaction."""

from __future__ import annotations

import uuid

from cyclone._storage.loader import Queries
from cyclone._storage.queries.conn import Conn, Record, execute, fetch


async def stream_append(
    conn: Conn, q: Queries, run_id: uuid.UUID, node: str, attempt: int, items: str
) -> list[int]:
    """Append ``items`` (the text of a JSON array) to the run's stream; the offsets given,
    in order, or none when the run ended or is gone."""
    rows = await fetch(
        conn, q, "stream_append", run_id=run_id, node=node, attempt=attempt, items=items
    )
    return sorted(r["seq"] for r in rows)


async def stream_read(
    conn: Conn, q: Queries, run_id: uuid.UUID, after: int, node: str | None, limit: int
) -> list[Record]:
    """``(state, head, seq, node, attempt, value, created_at)``: up to ``limit`` items past
    offset ``after`` with the run's stored state and last offset; one row with a NULL
    ``seq`` when none, no row when the run is not visible."""
    return await fetch(conn, q, "stream_read", run_id=run_id, after=after, node=node, limit=limit)


async def progress_set(
    conn: Conn, q: Queries, run_id: uuid.UUID, node: str, attempt: int, value: str
) -> None:
    """Overwrite the node's progress with ``value`` (JSON text)."""
    await execute(conn, q, "progress_set", run_id=run_id, node=node, attempt=attempt, value=value)


async def progress_get(conn: Conn, q: Queries, run_id: uuid.UUID) -> list[Record]:
    """``(node, attempt, value, writes, updated_at)`` per node; no row when the run is not
    visible, one with a NULL ``node`` when nothing was reported."""
    return await fetch(conn, q, "progress_get", run_id=run_id)
