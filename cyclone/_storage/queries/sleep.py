"""Statements of ``sql/sleep.sql``: waking sleep nodes."""

from __future__ import annotations

import uuid
from collections.abc import Sequence

from cyclone._storage.loader import Queries
from cyclone._storage.queries.conn import Conn, Record, fetch


async def sleep_wake_many(
    conn: Conn, q: Queries, run_ids: Sequence[uuid.UUID], nodes: Sequence[str]
) -> list[Record]:
    """Complete sleep nodes whose wake time has come; those completed (run_id, node)."""
    return await fetch(conn, q, "sleep_wake_many", run_ids=run_ids, nodes=nodes)
