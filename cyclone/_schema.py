"""Whether a schema's applied migrations are the ones this package ships.

A worker or command on a schema that lacks them would fail on every statement with a missing
relation or column; one that has migrations this package does not know may write rows the
newer code cannot read. Both are said once, with what to do, before any work starts.
"""

from __future__ import annotations

import asyncio
import logging

import asyncpg

from cyclone import _queries as db
from cyclone._errors import SchemaNotMigratedError, SchemaVersionError
from cyclone._sql import MIGRATIONS, Queries

logger = logging.getLogger("cyclone")

_SHIPPED = [m.version for m in MIGRATIONS]
_WAIT_FIRST = 0.1  # seconds before the first re-check while waiting for migrations
_WAIT_MAX = 5.0


async def check(conn: db.Conn, q: Queries) -> None:
    """Raise :class:`SchemaVersionError` or :class:`SchemaNotMigratedError` unless the schema
    has exactly the migrations this package ships."""
    try:
        applied = set(await db.migrations_applied(conn, q))
    except asyncpg.UndefinedTableError:  # no migrations table: never migrated
        applied = set()
    unknown = sorted(applied.difference(_SHIPPED))
    if unknown:  # checked first: migrating with this package cannot help
        raise SchemaVersionError(q.schema, unknown, _SHIPPED[-1])
    missing = [v for v in _SHIPPED if v not in applied]
    if missing:
        raise SchemaNotMigratedError(q.schema, missing, empty=not applied)


async def wait_until_migrated(pool: asyncpg.Pool, q: Queries) -> None:
    """Return once the schema is migrated, checking with a growing delay; say so once.

    :class:`SchemaVersionError` is raised at once: waiting cannot mend it.
    """
    delay = _WAIT_FIRST
    waiting = False
    while True:
        try:
            async with pool.acquire() as conn:
                await check(conn, q)
        except SchemaNotMigratedError as exc:
            if not waiting:
                logger.warning(
                    "cyclone: waiting for migrations: %s; checking again until they are applied",
                    exc,
                    extra={"schema": q.schema, "missing": exc.missing},
                )
                waiting = True
            await asyncio.sleep(delay)
            delay = min(delay * 2, _WAIT_MAX)
            continue
        if waiting:
            logger.info("cyclone: schema %r is migrated; starting", q.schema)
        return
