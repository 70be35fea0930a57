"""Where Cyclone's tables live (``sql/layout.sql``)."""

from __future__ import annotations

from cyclone._storage.loader import Queries
from cyclone._storage.queries.conn import Conn, Record, execute, fetchrow, fetchval


async def layout_citus(conn: Conn, q: Queries) -> str | None:
    """The version of the Citus extension in this database, or None without it."""
    version: str | None = await fetchval(conn, q, "layout_citus")
    return version


async def layout_citus_node(conn: Conn, q: Queries) -> Record:
    """On a database with Citus: this server's ``group_id`` (0: the coordinator), whether
    this session's catalog queries hide shards (``hides_shards``), whether the schema was
    ever migrated (``migrated``), the cluster's active
    ``nodes`` and Cyclone's ``tables`` in Citus's metadata, as ``name:method``
    (``sql/layout.sql``)."""
    row = await fetchrow(conn, q, "layout_citus_node", schema=q.schema)
    assert row is not None  # a SELECT of subqueries gives one row
    return row


async def layout_two_phase_create(conn: Conn, q: Queries) -> None:
    """Make the table :func:`layout_two_phase` writes, local to the Citus coordinator."""
    await execute(conn, q, "layout_two_phase_create")
    await execute(conn, q, "layout_two_phase_register")


async def layout_two_phase(conn: Conn, q: Queries) -> None:
    """Make Citus commit the caller's transaction in two phases (``sql/layout.sql``)."""
    await execute(conn, q, "layout_two_phase")
