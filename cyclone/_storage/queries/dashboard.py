"""The dashboard's read models (``sql/dashboard.sql``), each bounded."""

from __future__ import annotations

import uuid

from cyclone._storage.loader import Queries
from cyclone._storage.queries.conn import Conn, Record, fetch, fetchval
from cyclone._storage.queries.runs import RunFilters


async def run_search(
    conn: Conn, q: Queries, filters: RunFilters, *, limit: int, scan: int | None
) -> list[Record]:
    """One page (``limit`` runs) matching ``filters``, newest first, within a walk of at
    most ``scan`` runs from ``filters.cursor``."""
    return await fetch(conn, q, "run_search", **vars(filters), limit=limit, scan=scan)


async def run_walk_end(
    conn: Conn, q: Queries, cursor: uuid.UUID | None, scan: int
) -> uuid.UUID | None:
    """The last run a walk of ``scan`` runs from ``cursor`` reads; None if fewer are left."""
    found: uuid.UUID | None = await fetchval(conn, q, "run_walk_end", cursor=cursor, scan=scan)
    return found


async def run_count(
    conn: Conn, q: Queries, filters: RunFilters, *, cap: int, scan: int | None
) -> int:
    """How many runs match ``filters`` (as run_search), counting up to ``cap``."""
    count: int = await fetchval(conn, q, "run_count", **vars(filters), limit=cap, scan=scan)
    return count


async def node_payloads(conn: Conn, q: Queries, run_id: uuid.UUID) -> list[Record]:
    """Each node's queue, output and signal payload."""
    return await fetch(conn, q, "node_payloads", run_id=run_id)


async def throughput_minutes(conn: Conn, q: Queries, minutes: int) -> list[Record]:
    """Completed and failed steps per queue and minute over the last ``minutes``."""
    return await fetch(conn, q, "throughput_minutes", minutes=minutes)
