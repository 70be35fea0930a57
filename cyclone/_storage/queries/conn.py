"""The connection every query runs on, the errors it may raise, and how a named statement
is sent: its values by parameter name, bound to ``$n`` by :meth:`Queries.bind`.

Every statement of Cyclone's goes through :func:`execute`, :func:`fetch`, :func:`fetchrow` or
:func:`fetchval`, which is where a schema that lacks Cyclone's tables (never migrated, or
older than this package) is told apart from any other failure: the server's "relation does
not exist" becomes :class:`~cyclone.SchemaNotMigratedError`, which says to migrate.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg

from cyclone._model.errors import SchemaNotMigratedError
from cyclone._storage.loader import MIGRATIONS, Queries

Conn = asyncpg.Connection | asyncpg.pool.PoolConnectionProxy
Record = asyncpg.Record

# What a statement raises when the server or the connection fails under it, rather than for
# what the statement asked: a background loop logs these and carries on. A schema that lost
# Cyclone's tables under a running worker is one such failure: its loops say so and go on.
DATABASE_ERRORS = (
    OSError,
    asyncpg.PostgresError,
    asyncpg.InterfaceError,
    asyncpg.InternalClientError,
    SchemaNotMigratedError,
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

# The SQLSTATEs of a statement naming an object that does not exist: undefined_table,
# undefined_function, undefined_column. Read from the error's ``sqlstate``, which both
# drivers' errors have (asyncpg's, and psycopg's under the synchronous client).
_UNDEFINED_OBJECT = {"42P01", "42883"}
_UNDEFINED_COLUMN = "42703"
# The columns that migrations add to tables made by earlier ones: a statement that names one
# on a schema that lacks its migration finds the table but not the column.
_ADDED_COLUMNS = re.compile(
    r"\b(?:"
    + "|".join(
        sorted(
            {
                column
                for migration in MIGRATIONS
                for column in re.findall(r"\bADD COLUMN (\w+)", migration.sql, re.IGNORECASE)
            }
        )
    )
    + r")\b"
)


def missing_from_schema(q: Queries, exc: BaseException) -> SchemaNotMigratedError | None:
    """The :class:`SchemaNotMigratedError` that ``exc``, raised by one of Cyclone's
    statements, stands for, or None when it is about something else.

    Only a missing Cyclone object counts: a ``cyclone_`` table or function (every relation
    Cyclone's statements name is one, in the client's schema), or a column that one of
    Cyclone's migrations adds. A typo in a statement or a missing extension is not one.
    """
    sqlstate = getattr(exc, "sqlstate", None)
    if sqlstate in _UNDEFINED_OBJECT:
        ours = "cyclone_" in str(exc)
    elif sqlstate == _UNDEFINED_COLUMN:
        ours = _ADDED_COLUMNS.search(str(exc)) is not None
    else:
        return None
    if not ours:
        return None
    return SchemaNotMigratedError(q.schema, [], empty=False, found=str(exc).split("\n")[0])


# Each sender translates a missing Cyclone object where it is raised, so every call of every
# client gets it; a try costs nothing until something raises. The error is asyncpg's or, on
# the synchronous client, psycopg's: both carry ``sqlstate``, read before anything else.


def _raise_if_missing(q: Queries, exc: Exception) -> None:
    """Raise the :class:`SchemaNotMigratedError` that ``exc`` stands for, if it is one."""
    if (missing := missing_from_schema(q, exc)) is not None:
        raise missing from exc


async def execute(conn: Conn, q: Queries, statement: str, /, **params: object) -> None:
    """Run ``statement`` with its parameters by name."""
    await _send(conn.execute, q, statement, params)


async def fetch(conn: Conn, q: Queries, statement: str, /, **params: object) -> list[Record]:
    """Run ``statement`` with its parameters by name; its rows."""
    rows: list[Record] = await _send(conn.fetch, q, statement, params)
    return rows


async def fetchrow(conn: Conn, q: Queries, statement: str, /, **params: object) -> Record | None:
    """Run ``statement`` with its parameters by name; its first row, if any."""
    row: Record | None = await _send(conn.fetchrow, q, statement, params)
    return row


async def fetchval(conn: Conn, q: Queries, statement: str, /, **params: object) -> Any:
    """Run ``statement`` with its parameters by name; the first column of its first row."""
    return await _send(conn.fetchval, q, statement, params)


async def _send(
    method: Callable[..., Awaitable[Any]], q: Queries, statement: str, params: dict[str, object]
) -> Any:
    """Bind ``statement``'s parameters and send it with ``method`` (one of the connection's);
    a schema that lacks Cyclone's objects raises :class:`SchemaNotMigratedError`."""
    sql, args = q.bind(statement, params)
    try:
        return await method(sql, *args)
    except Exception as exc:
        _raise_if_missing(q, exc)
        raise
