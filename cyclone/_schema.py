"""What a worker or command checks before any work starts: the database answers, and the
schema's applied migrations are the ones this package ships.

A worker or command on a schema that lacks them would fail on every statement with a missing
relation or column; one that has migrations this package does not know may write rows the
newer code cannot read. Both are said once, with what to do, before any work starts. A worker
started while PostgreSQL is down (a deploy racing a database restart) waits for it instead of
failing: one waiting loop, with a growing, jittered delay, logs each reason it waits once.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time

import asyncpg

from cyclone import _pooler
from cyclone import _queries as db
from cyclone._errors import SchemaNotMigratedError, SchemaVersionError
from cyclone._sql import MIGRATIONS, Queries

logger = logging.getLogger("cyclone")

_SHIPPED = [m.version for m in MIGRATIONS]
_WAIT_FIRST = 0.1  # seconds before the first re-check while waiting
_WAIT_MAX = 5.0
# Failures to reach the database that waiting can mend: the server is down, starting up,
# shutting down, or out of connection slots. A wrong password or database name is not one.
UNREACHABLE = (*db.RETRYABLE_ERRORS, asyncpg.TooManyConnectionsError)


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


async def wait_until_ready(
    pool: asyncpg.Pool, q: Queries, *, wait_for_schema: bool, listens: bool
) -> None:
    """Return once the database answers and the schema is this package's; then check the
    pool's route to PostgreSQL (:func:`cyclone._pooler.check`; ``listens``: this process
    LISTENs through the pool).

    Waits while the database cannot be reached and, with ``wait_for_schema``, while the schema
    lacks migrations; each reason is logged once. :class:`SchemaNotMigratedError` (without
    ``wait_for_schema``), :class:`SchemaVersionError` and any other database error are raised
    at once: waiting cannot mend them. Only the caller's cancellation ends the wait early.
    """
    delay = _WAIT_FIRST
    said: set[str] = set()
    began = time.monotonic()
    last: BaseException | None = None
    while True:
        try:
            async with pool.acquire() as conn:
                await check(conn, q)
            break
        except UNREACHABLE as exc:
            last = exc
            if "unreachable" not in said:
                said.add("unreachable")
                logger.warning(
                    "cyclone: cannot reach the database (%s: %s); waiting for it, trying "
                    "again with a growing delay (at most %g s)",
                    type(exc).__name__,
                    exc,
                    _WAIT_MAX,
                    extra={"schema": q.schema},
                )
        except SchemaNotMigratedError as exc:
            last = exc
            if not wait_for_schema:
                raise
            if "migrations" not in said:
                said.add("migrations")
                logger.warning(
                    "cyclone: waiting for migrations: %s; checking again until they are applied",
                    exc,
                    extra={"schema": q.schema, "missing": exc.missing},
                )
        try:
            await asyncio.sleep(delay * random.uniform(0.5, 1.0))
        except asyncio.CancelledError:
            logger.warning(
                "cyclone: stopped waiting for the database after %.1f s (cancelled); the last "
                "check failed with %s: %s",
                time.monotonic() - began,
                type(last).__name__,
                last,
                extra={"schema": q.schema},
            )
            raise
        delay = min(delay * 2, _WAIT_MAX)
    if said:
        logger.info(
            "cyclone: the database answers and schema %r is migrated, after %.1f s; starting",
            q.schema,
            time.monotonic() - began,
            extra={"schema": q.schema},
        )
    await _pooler.check(pool, q, listens=listens)
