"""Child runs (``sql/children.sql``): their parent link, and settling the parent's node."""

from __future__ import annotations

import uuid
from collections.abc import Sequence

from cyclone._storage.loader import Queries
from cyclone._storage.queries.conn import Conn, Record, execute, fetch


async def child_link(
    conn: Conn, q: Queries, run_id: uuid.UUID, parent_run: uuid.UUID, parent_node: str
) -> None:
    """Make ``run_id`` the child run of node ``parent_node`` of ``parent_run``."""
    await execute(
        conn, q, "child_link", run_id=run_id, parent_run=parent_run, parent_node=parent_node
    )


async def child_settle(conn: Conn, q: Queries, run_ids: Sequence[uuid.UUID]) -> list[Record]:
    """Settle the parent nodes of those runs that ended and are children (what, value,
    run_id, node of each parent node)."""
    return await fetch(conn, q, "child_settle", run_ids=run_ids)


async def run_children(conn: Conn, q: Queries, run_ids: Sequence[uuid.UUID]) -> list[uuid.UUID]:
    """The child runs of ``run_ids`` that have not ended."""
    return [r["id"] for r in await fetch(conn, q, "run_children", run_ids=run_ids)]
