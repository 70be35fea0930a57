"""Whether the pool reaches PostgreSQL through a pooler in transaction mode, and whether this
process's configuration works through one.

A pooler such as PgBouncer answers a client's startup with a backend key of its own, so the pid
asyncpg was told (``get_server_pid()``) is not ``pg_backend_pid()``: something sits in between.
In transaction mode (PgBouncer's ``pool_mode = transaction``) it hands a server connection to
another client as soon as a transaction ends. That is proved when a second client's transaction
gets the very backend our connection just used, which PgBouncer's default (``server_round_robin
= 0``: the most recently used server connection first) makes likely on a quiet pooler. Then two
things Cyclone would rely on do not hold:

- asyncpg's statement cache: named prepared statements stay on the backend that prepared them,
  and a later statement of this connection may run on another one (``prepared statement
  "__asyncpg_stmt_8__" does not exist``). Proved when the second client's transaction sees our
  statement's name in ``pg_prepared_statements``; a pooler that tracks prepared statements
  itself (PgBouncer 1.21 and later with ``max_prepared_statements``) renames them, so it passes.
- LISTEN: the listening session is not kept, so notifications never arrive.

A proof that does not come off (another client took the backend, round robin) proves nothing,
and nothing is raised: the check never refuses a configuration that works.
"""

from __future__ import annotations

import uuid

import asyncpg

from cyclone._model.errors import UnsupportedPoolerError
from cyclone._services.notifier import connect_like
from cyclone._storage import queries as db
from cyclone._storage.loader import Queries

_TRIES = 3
_POOLER = "the pool goes through a connection pooler in transaction mode (PgBouncer?)"
STATEMENT_CACHE = (
    f"{_POOLER}, and asyncpg's statement cache is on: its prepared statements would fail "
    "later with 'prepared statement \"__asyncpg_stmt_N__\" does not exist'; create the pool "
    "with statement_cache_size=0 (CLI: --statement-cache-size 0)"
)
LISTEN = (
    f"{_POOLER}, where LISTEN receives nothing: pass notify=False to cyclone.Client to poll "
    "(CLI: --no-notify), or listen_dsn= a DSN straight to PostgreSQL (CLI: --listen-dsn)"
)


def _statement_cache_size(pool: asyncpg.Pool) -> int:
    # asyncpg keeps the pool's connect arguments private; 100 is its default.
    kwargs = pool._connect_kwargs  # type: ignore[attr-defined]
    size: int = kwargs.get("statement_cache_size", 100)
    return size


async def check(pool: asyncpg.Pool, q: Queries, *, listens: bool) -> None:
    """Raise :class:`UnsupportedPoolerError` if the pool goes through a pooler in transaction
    mode with asyncpg's statement cache on, or if ``listens`` (this process LISTENs through
    the pool's route)."""
    named = _statement_cache_size(pool) > 0
    async with pool.acquire() as conn:
        if await db.server_backend_pid(conn, q) == conn.get_server_pid():
            return  # straight to PostgreSQL (or a pooler that passes the backend's key on)
        for _ in range(_TRIES):
            found = await _hand_over(pool, conn, q, named=named)
            if found is not None:
                break
        else:
            return
    if named and found:
        raise UnsupportedPoolerError(STATEMENT_CACHE)
    if listens:
        raise UnsupportedPoolerError(LISTEN)


async def _hand_over(pool: asyncpg.Pool, conn: db.Conn, q: Queries, *, named: bool) -> bool | None:
    """``None`` if another client's transaction did not get the backend ``conn`` last used;
    else whether a statement ``conn`` prepared (when ``named``) was visible on it."""
    name = f"cyclone_probe_{uuid.uuid4().hex}" if named else None
    try:
        pid = await db.server_backend_pid(conn, q, prepared_as=name)
    except asyncpg.InvalidSQLStatementNameError:
        return True  # prepared on one backend, run on another: the names are the server's
    other = await connect_like(pool)
    try:
        async with other.transaction():
            if await db.server_backend_pid(other, q) != pid:
                return None
            return name is not None and await db.server_statement_exists(other, q, name)
    finally:
        await other.close()
