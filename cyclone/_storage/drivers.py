"""psycopg 3 as a second driver for the same statements (the synchronous client's).

Everything that talks to the database (``queries`` and the insert path) is written once, as
coroutines over asyncpg's call surface (``execute``, ``fetch``, ``fetchrow``, ``fetchval`` with
``$n`` parameters). :class:`PsycopgConnection` offers that surface over a psycopg connection:
its methods are coroutines that do their work synchronously and never suspend, so
:func:`run_sync` drives one of those coroutines to its end without an event loop. The named
statements go to the server as they are, through psycopg's ``RawCursor`` (which takes the
server's own ``$n`` placeholders), so both drivers send the same text with the same casts.
"""

from __future__ import annotations

from collections.abc import Coroutine, Iterator, Sequence
from typing import TYPE_CHECKING, Any, TypeVar, cast

import psycopg
from psycopg import pq
from psycopg.types.string import TextLoader

if TYPE_CHECKING:
    from cyclone._storage.queries import Conn

_T = TypeVar("_T")
# psycopg decodes json and jsonb; asyncpg (without codecs) gives their text, as Cyclone reads.
_AS_TEXT = ("json", "jsonb")


class Record:
    """A row as asyncpg gives it: by position, by column name, and ``dict(row)``."""

    __slots__ = ("_index", "_values")

    def __init__(self, index: dict[str, int], values: Sequence[Any]) -> None:
        self._index = index
        self._values = values

    def __getitem__(self, key: int | str) -> Any:
        return self._values[key if isinstance(key, int) else self._index[key]]

    def __iter__(self) -> Iterator[Any]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def keys(self) -> list[str]:
        """The column names."""
        return list(self._index)

    def get(self, key: str, default: Any = None) -> Any:
        """The value of column ``key``, or ``default``."""
        return self[key] if key in self._index else default

    def __repr__(self) -> str:
        return f"<Record {dict(zip(self._index, self._values, strict=True))!r}>"


class PsycopgConnection:
    """asyncpg's call surface over a psycopg connection, for Cyclone's own statements.

    Each method completes without suspending (see :func:`run_sync`). It never begins or
    commits: on a connection that is not in autocommit mode psycopg begins a transaction at
    the first statement, which commits or rolls back with the caller's.
    """

    __slots__ = ("conn",)

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self.conn = conn

    def is_in_transaction(self) -> bool:
        """Whether the connection has a transaction open on the server."""
        return self.conn.info.transaction_status != pq.TransactionStatus.IDLE

    def _cursor(self, query: str, args: Sequence[Any]) -> psycopg.RawCursor[Any]:
        cur = psycopg.RawCursor(self.conn)
        for name in _AS_TEXT:
            cur.adapters.register_loader(name, TextLoader)
        cur.execute(query, args)
        return cur

    async def execute(self, query: str, *args: Any) -> str:
        """Run a statement; return its status (``INSERT 0 1``)."""
        with self._cursor(query, args) as cur:
            return cur.statusmessage or ""

    async def fetch(self, query: str, *args: Any) -> list[Record]:
        """Run a query; return its rows."""
        with self._cursor(query, args) as cur:
            index = {c.name: i for i, c in enumerate(cur.description or ())}
            return [Record(index, row) for row in cur.fetchall()]

    async def fetchrow(self, query: str, *args: Any) -> Record | None:
        """Run a query; return its first row, if any."""
        rows = await self.fetch(query, *args)
        return rows[0] if rows else None

    async def fetchval(self, query: str, *args: Any) -> Any:
        """Run a query; return the first column of its first row (None without rows)."""
        row = await self.fetchrow(query, *args)
        return None if row is None else row[0]


def connect(conn: psycopg.Connection[Any]) -> Conn:
    """``conn`` with asyncpg's surface, typed as the connection the shared statements take
    (they use only ``execute``, ``fetch``, ``fetchrow``, ``fetchval``, ``is_in_transaction``)."""
    return cast("Conn", PsycopgConnection(conn))


def run_sync(coro: Coroutine[Any, Any, _T]) -> _T:
    """Run ``coro`` to its end here, without an event loop.

    Only for coroutines whose awaits all complete at once (those on a
    :class:`PsycopgConnection` and on the synchronous client's targets): one step finishes it.
    """
    try:
        coro.send(None)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]
    coro.close()
    raise RuntimeError("a synchronous Cyclone call awaited something asynchronous (a bug)")
