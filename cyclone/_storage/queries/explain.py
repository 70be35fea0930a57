"""Why a run's work is not running (``sql/explain.sql``): the facts behind each open node."""

from __future__ import annotations

import uuid

from cyclone._storage.loader import Queries
from cyclone._storage.queries.conn import Conn, Record, fetch


async def node_explain(conn: Conn, q: Queries, run_id: uuid.UUID, limit: int) -> list[Record]:
    """The open nodes of pending run ``run_id`` (at most ``limit``), each with the facts its
    reason is told from, and how many are open in all (``open``)."""
    return await fetch(conn, q, "node_explain", run_id=run_id, limit=limit)
