"""Forked runs (``sql/forks.sql``): writing a fork, reading the links between a fork and the
run it came from."""

from __future__ import annotations

import uuid
from typing import Any

from cyclone._storage.loader import Queries
from cyclone._storage.queries.conn import Conn, Record, fetch, fetchval


async def run_fork(
    conn: Conn,
    q: Queries,
    run_id: uuid.UUID,
    source: uuid.UUID,
    input: str | None,
    arguments: dict[str, Any],
) -> uuid.UUID | None:
    """Write the fork ``run_id`` of run ``source`` (``arguments``: the rest of ``run_fork``'s
    parameters, from its plan); None when its key was taken."""
    inserted: uuid.UUID | None = await fetchval(
        conn, q, "run_fork", id=run_id, source=source, input=input, **arguments
    )
    return inserted


async def run_fork_links(conn: Conn, q: Queries, run_id: uuid.UUID) -> list[Record]:
    """Where the run was forked from ('from') and its forks ('fork'): what, run_id, node."""
    return await fetch(conn, q, "run_fork_links", run_id=run_id)
