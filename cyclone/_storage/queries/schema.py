"""Applying migrations (``sql/schema.sql``)."""

from __future__ import annotations

from cyclone._storage.loader import Queries
from cyclone._storage.queries.conn import Conn, execute, fetch


async def migrations_apply(conn: Conn, q: Queries, lock_timeout: str) -> list[int]:
    """Apply the migrations this schema lacks, under a lock, each of their own locks waited
    for ``lock_timeout`` at most (``asyncpg.LockNotAvailableError`` past it); return the
    versions applied."""
    await execute(conn, q, "migrations_lock", schema=q.schema)
    await execute(conn, q, "migrations_lock_timeout", timeout=lock_timeout)
    await execute(conn, q, "schema_create")
    await execute(conn, q, "migrations_table")
    applied = set(await migrations_applied(conn, q))
    done = []
    for migration in q.migrations:
        if migration.version in applied:
            continue
        await conn.execute(migration.sql)
        await execute(conn, q, "migrations_record", version=migration.version, name=migration.name)
        done.append(migration.version)
    return done


async def migrations_applied(conn: Conn, q: Queries) -> list[int]:
    """Versions recorded in the migrations table."""
    return [r["version"] for r in await fetch(conn, q, "migrations_applied")]
