"""Applying migrations (``sql/schema.sql``)."""

from __future__ import annotations

from cyclone._storage.loader import Migration, Queries
from cyclone._storage.queries.conn import Conn, execute, fetch, fetchval


async def migrations_apply(
    conn: Conn, q: Queries, lock_timeout: str
) -> tuple[list[int], Migration | None] | None:
    """In the caller's transaction, apply the migrations this schema lacks up to the first
    concurrent one, each of their locks waited for ``lock_timeout`` at most
    (``asyncpg.LockNotAvailableError`` past it); return the versions applied and the
    concurrent migration next in line, if any. ``None``, having applied nothing, while
    another session migrates the schema."""
    if not await fetchval(conn, q, "migrations_lock", schema=q.schema):
        return None
    await execute(conn, q, "migrations_lock_timeout", timeout=lock_timeout)
    await execute(conn, q, "schema_create")
    await execute(conn, q, "migrations_table")
    applied = set(await migrations_applied(conn, q))
    done: list[int] = []
    for migration in q.migrations:
        if migration.version in applied:
            continue
        if migration.builds:
            return done, migration
        await conn.execute(migration.sql)
        await execute(conn, q, "migrations_record", version=migration.version, name=migration.name)
        done.append(migration.version)
    return done, None


async def migration_apply_concurrently(conn: Conn, q: Queries, migration: Migration) -> bool | None:
    """Outside a transaction, apply a concurrent migration statement by statement, under the
    schema's migrations lock held by the session; whether this call applied it (``False``:
    another session had). ``None``, having done nothing, while another session migrates.

    A build that fails leaves its index invalid; the next call drops it and builds it again.
    """
    if not await fetchval(conn, q, "migrations_session_lock", schema=q.schema):
        return None
    try:
        if migration.version in await migrations_applied(conn, q):
            return False
        for build in migration.builds:
            if build.index is not None and await fetchval(
                conn, q, "index_invalid", schema=q.schema, index=build.index
            ):
                await conn.execute(q.index_drop(build.index))
            await conn.execute(build.sql)
        await execute(conn, q, "migrations_record", version=migration.version, name=migration.name)
        return True
    finally:
        if not conn.is_closed():
            await execute(conn, q, "migrations_session_unlock", schema=q.schema)


async def migrations_applied(conn: Conn, q: Queries) -> list[int]:
    """Versions recorded in the migrations table."""
    return [r["version"] for r in await fetch(conn, q, "migrations_applied")]
