"""The connection every query runs on, the errors it may raise, and how a named statement
is sent: its values by parameter name, bound to ``$n`` by :meth:`Queries.bind`."""

from __future__ import annotations

from typing import Any

import asyncpg

from cyclone._sql import Queries

Conn = asyncpg.Connection | asyncpg.pool.PoolConnectionProxy
Record = asyncpg.Record

# What a statement raises when the server or the connection fails under it, rather than for
# what the statement asked: a background loop logs these and carries on.
DATABASE_ERRORS = (
    OSError,
    asyncpg.PostgresError,
    asyncpg.InterfaceError,
    asyncpg.InternalClientError,
)
# Of those, the failures after which sending the statement again is safe: the connection
# went away (the transaction may or may not have committed: every outcome write is fenced,
# so a second try cannot apply twice) or a deadlock or serialization failure aborted it.
RETRYABLE_ERRORS = (
    OSError,
    asyncpg.PostgresConnectionError,
    asyncpg.InterfaceError,
    asyncpg.InternalClientError,
    asyncpg.DeadlockDetectedError,
    # A single statement at a session default of REPEATABLE READ or SERIALIZABLE met a row
    # updated after its snapshot: it wrote nothing, so sending it again is safe.
    asyncpg.SerializationError,
    asyncpg.exceptions.OperatorInterventionError,
    # The server refused a new connection for now ("too many clients"): it can take one later.
    asyncpg.TooManyConnectionsError,
)


async def execute(conn: Conn, q: Queries, statement: str, /, **params: object) -> None:
    """Run ``statement`` with its parameters by name."""
    sql, args = q.bind(statement, params)
    await conn.execute(sql, *args)


async def fetch(conn: Conn, q: Queries, statement: str, /, **params: object) -> list[Record]:
    """Run ``statement`` with its parameters by name; its rows."""
    sql, args = q.bind(statement, params)
    return await conn.fetch(sql, *args)


async def fetchrow(conn: Conn, q: Queries, statement: str, /, **params: object) -> Record | None:
    """Run ``statement`` with its parameters by name; its first row, if any."""
    sql, args = q.bind(statement, params)
    return await conn.fetchrow(sql, *args)


async def fetchval(conn: Conn, q: Queries, statement: str, /, **params: object) -> Any:
    """Run ``statement`` with its parameters by name; the first column of its first row."""
    sql, args = q.bind(statement, params)
    return await conn.fetchval(sql, *args)
