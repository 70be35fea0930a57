"""Wait nodes (``sql/waits.sql``): storing signals, completing signalled wait nodes, and why
a signal was refused."""

from __future__ import annotations

import uuid
from collections.abc import Sequence

from cyclone._storage.loader import Queries
from cyclone._storage.queries.conn import Conn, Record, fetch, fetchrow, fetchval


async def wait_complete_many(
    conn: Conn, q: Queries, run_ids: Sequence[uuid.UUID], nodes: Sequence[str]
) -> list[Record]:
    """Complete signalled, reachable wait nodes (those waiting for all of their events once
    every one came)."""
    return await fetch(conn, q, "wait_complete_many", run_ids=run_ids, nodes=nodes)


async def wait_signal(
    conn: Conn, q: Queries, run_id: uuid.UUID, node: str, payload: str, event: str | None
) -> str | None:
    """Store a wait node's signal (of ``event``, for a node waiting for events); the node's
    state, or None if nothing was stored."""
    state: str | None = await fetchval(
        conn, q, "wait_signal", run_id=run_id, node=node, payload=payload, event=event
    )
    return state


async def node_get(conn: Conn, q: Queries, run_id: uuid.UUID, node: str) -> Record | None:
    """A node's kind, state and events, and what it was signalled."""
    return await fetchrow(conn, q, "node_get", run_id=run_id, node=node)
