"""What a worker or command checks before any work starts: the database answers, and the
schema's applied migrations are the ones this package ships.

A worker or command on a schema that lacks them would fail on every statement with a missing
relation or column; one that has migrations this package does not know may write rows the
newer code cannot read. Both are said once, with what to do, before any work starts. A worker
started while PostgreSQL is down (a deploy racing a database restart) waits for it instead of
failing: one waiting loop, with a growing, jittered delay, logs each reason it waits once.
When nothing at all has answered at the pool's address (refused, no such host, no socket),
it says so with the address: a wrong host or port waits exactly like a database that is down,
and only the address tells them apart.

The messages carry no "cyclone:" prefix: the logger is named ``cyclone``, and naming the
logger is the formatter's job (``%(name)s``).
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import socket
import time
import urllib.parse

import asyncpg

from cyclone._model.errors import SchemaNotMigratedError, SchemaVersionError
from cyclone._services import pooler
from cyclone._storage import queries as db
from cyclone._storage.loader import MIGRATIONS, Queries

logger = logging.getLogger("cyclone")

_SHIPPED = [m.version for m in MIGRATIONS]
_WAIT_FIRST = 0.1  # seconds before the first re-check while waiting
_WAIT_MAX = 5.0
# Failures to reach the database that waiting can mend: the server is down, starting up,
# shutting down, or out of connection slots. A wrong password or database name is not one.
UNREACHABLE = (*db.RETRYABLE_ERRORS, asyncpg.TooManyConnectionsError)
# Of those, the ones where no server answered at all: refused, a host name that does not
# resolve, no socket file, or no reply before the connect timeout.
_SILENT = (ConnectionRefusedError, socket.gaierror, FileNotFoundError, TimeoutError)


async def check(conn: db.Conn, q: Queries) -> None:
    """Raise :class:`SchemaVersionError` or :class:`SchemaNotMigratedError` unless the schema
    has exactly the migrations this package ships."""
    try:
        applied = set(await db.migrations_applied(conn, q))
    except SchemaNotMigratedError:  # no migrations table: never migrated
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
    pool's route to PostgreSQL (:func:`cyclone._services.pooler.check`; ``listens``: this process
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
            if "unreachable" not in said:  # one warning for the whole wait
                said.add("unreachable")
                _log_unreachable(pool, q, exc)
        except SchemaNotMigratedError as exc:
            last = exc
            if not wait_for_schema:
                raise
            if "migrations" not in said:
                said.add("migrations")
                logger.warning(
                    "waiting for migrations: %s; checking again until they are applied",
                    exc,
                    extra={"schema": q.schema, "missing": exc.missing},
                )
        try:
            await asyncio.sleep(delay * random.uniform(0.5, 1.0))
        except asyncio.CancelledError:
            logger.warning(
                "stopped waiting for the database after %.1f s (cancelled); the last "
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
            "the database answers and schema %r is migrated, after %.1f s; starting",
            q.schema,
            time.monotonic() - began,
            extra={"schema": q.schema},
        )
    await pooler.check(pool, q, listens=listens)


def _log_unreachable(pool: asyncpg.Pool, q: Queries, exc: BaseException) -> None:
    """The warning for a database that cannot be reached: where nothing answered, with the
    address to check, or that the server answered but cannot take a connection now."""
    retry = f"waiting for it, trying again with a growing delay (at most {_WAIT_MAX:g} s)"
    if isinstance(exc, _SILENT):
        logger.warning(
            "nothing has answered at %s since the worker started (%s: %s): if the database "
            "is not on its way, check the DSN's host and port; %s",
            address(pool),
            type(exc).__name__,
            exc,
            retry,
            extra={"schema": q.schema},
        )
    else:
        logger.warning(
            "cannot reach the database (%s: %s); %s",
            type(exc).__name__,
            exc,
            retry,
            extra={"schema": q.schema},
        )


def address(pool: asyncpg.Pool) -> str:
    """Where ``pool`` connects, for a message: ``host:port``, a socket's path, or the DSN's
    hosts as written when it names several.

    asyncpg keeps the DSN and keyword arguments of a pool only in private attributes, as
    ``notifier.connect_like`` reads them; where neither names a host or port, libpq's
    defaults apply (``PGHOST``, ``PGPORT``, localhost:5432).
    """
    args: list[object] = list(pool._connect_args) or [None]  # type: ignore[attr-defined]
    kwargs: dict[str, object] = pool._connect_kwargs  # type: ignore[attr-defined]
    parts = urllib.parse.urlsplit(args[0] if isinstance(args[0], str) else "")
    query = urllib.parse.parse_qs(parts.query)
    hosts = parts.netloc.rpartition("@")[2]
    try:
        url_port = parts.port
    except ValueError:  # several hosts (h1:5432,h2:5433): say them as written
        return hosts
    host = kwargs.get("host") or query.get("host", [""])[0] or parts.hostname
    host = host or os.environ.get("PGHOST") or "localhost"
    port = kwargs.get("port") or query.get("port", [""])[0] or url_port
    port = port or os.environ.get("PGPORT") or 5432
    if isinstance(host, list | tuple):
        host = ",".join(map(str, host))
    if str(host).startswith("/"):  # a socket directory
        return f"{host}/.s.PGSQL.{port}"
    return f"{host}:{port}"
