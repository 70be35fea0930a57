"""Applying migrations under load (``Client.migrate``).

Pending migrations are applied in order, as many at a time as run in one transaction: up to
the next concurrent one (an index built ``CONCURRENTLY``), which runs on its own, outside a
transaction, before the rest. One process migrates a schema at a time; the others wait for
it, polling its lock (``migrations_lock`` says why they never wait in a statement).

A migration's statement waits :data:`LOCK_TIMEOUT` at most for a table's lock: past it the
whole transaction rolls back and is tried again, up to :data:`_TRIES` times, so that a long
transaction on a hot table holds claims and enqueues back for a moment, not for as long as
it lasts. A concurrent build takes no lock that stops them, and waits as long as it must.
"""

from __future__ import annotations

import asyncio
import logging

import asyncpg

from cyclone._model.errors import ReadOnlyServerError
from cyclone._services.database import Database
from cyclone._storage import queries as db
from cyclone._storage.loader import Migration

logger = logging.getLogger("cyclone")

LOCK_TIMEOUT = "1s"
"""How long a migration's statement waits for a table's lock before migrate tries again."""
_TRIES = 30  # of a migrating transaction that met a deadlock, or a lock held too long
_BUSY = 0.2  # seconds between tries of the lock another process holds


async def migrate(database: Database) -> list[int]:
    """Apply the migrations the schema lacks; the versions this call applied."""
    done: list[int] = []
    try:
        while True:
            applied, concurrent = await _in_transactions(database)
            done += applied
            if concurrent is None:
                break
            if await _concurrently(database, concurrent):
                done.append(concurrent.version)
    except asyncpg.ReadOnlySQLTransactionError as exc:
        raise ReadOnlyServerError(database.queries.schema) from exc
    schema = database.queries.schema
    if done:
        logger.info("applied migrations %s to schema %s", done, schema, extra={"schema": schema})
    if database.layout.citus:
        description = database.layout.description
        logger.info("schema %s is on %s", schema, description, extra={"schema": schema})
    return done


async def _in_transactions(database: Database) -> tuple[list[int], Migration | None]:
    """The pending migrations up to the next concurrent one, in one transaction, tried again
    when it meets a deadlock or a lock held too long."""
    schema = database.queries.schema
    attempt = 1
    while True:
        try:
            async with database.transact() as conn:
                await database.layout.refuse(conn)  # before any DDL: a worker node of Citus
                result = await db.migrations_apply(conn, database.queries, LOCK_TIMEOUT)
                if result is not None and result[1] is None:  # the last of them: the layout
                    await database.layout.prepare(conn)
        except (asyncpg.DeadlockDetectedError, asyncpg.LockNotAvailableError) as exc:
            # A migration that locks tables can meet running workers locking rows in
            # another order (PostgreSQL aborts one side, and both try again), or a long
            # transaction holding a table it alters: it gives way rather than queue every
            # claim behind it, and tries again.
            if attempt == _TRIES:
                raise
            met = (
                "a deadlock with"
                if isinstance(exc, asyncpg.DeadlockDetectedError)
                else f"a lock held over {LOCK_TIMEOUT} by"
            )
            attempt += 1
            logger.warning(
                "migrating schema %s met %s another session; rolled back, trying again (%d of %d)",
                schema,
                met,
                attempt,
                _TRIES,
                extra={"schema": schema},
            )
            await asyncio.sleep(min(2.0, 0.05 * attempt))
            continue
        if result is not None:
            return result
        await asyncio.sleep(_BUSY)  # another process migrates the schema


async def _concurrently(database: Database, migration: Migration) -> bool:
    """Apply one concurrent migration on a session of its own; whether this call did."""
    schema = database.queries.schema
    logger.info(
        "applying migration %04d_%s to schema %s outside a transaction (concurrent index "
        "builds: they wait for transactions open on their tables, and block none)",
        migration.version,
        migration.name,
        schema,
        extra={"schema": schema},
    )
    async with database.acquire() as conn:
        while True:
            done = await db.migration_apply_concurrently(conn, database.queries, migration)
            if done is not None:
                return done
            await asyncio.sleep(_BUSY)  # another process migrates the schema
