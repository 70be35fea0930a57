"""What a worker or command asks about the server it reached (``sql/server.sql``)."""

from __future__ import annotations

from cyclone._storage.loader import Queries
from cyclone._storage.queries.conn import Conn, fetchval


async def server_backend_pid(conn: Conn, q: Queries, *, prepared_as: str | None = None) -> int:
    """The pid of the backend that runs this statement; ``prepared_as``: run it as a named
    prepared statement of that name, left on the server (a pooler probe's evidence)."""
    if prepared_as is None:
        pid: int = await fetchval(conn, q, "server_backend_pid")
        return pid
    statement = await conn.prepare(q["server_backend_pid"], name=prepared_as)
    pid = await statement.fetchval()
    return pid


async def server_statement_exists(conn: Conn, q: Queries, name: str) -> bool:
    """Whether the backend running this statement holds a prepared statement ``name``."""
    found: bool = await fetchval(conn, q, "server_statement_exists", name=name)
    return found
