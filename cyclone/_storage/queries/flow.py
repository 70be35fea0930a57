"""Flow control (``sql/flow.sql``): paused queues and limits, set by operators."""

from __future__ import annotations

from cyclone._storage.loader import Queries
from cyclone._storage.queries.conn import Conn, Record, execute, fetch, fetchval


async def queue_limits_set(
    conn: Conn,
    q: Queries,
    queue: str,
    concurrency: int | None,
    rate: int | None,
    per: float | None,
    key_concurrency: int | None,
    key_rate: int | None,
    key_per: float | None,
) -> None:
    """Replace a queue's limits (NULL: none)."""
    await execute(
        conn,
        q,
        "queue_limits_set",
        queue=queue,
        concurrency=concurrency,
        rate=rate,
        per=per,
        key_concurrency=key_concurrency,
        key_rate=key_rate,
        key_per=key_per,
    )


async def queue_pause_set(conn: Conn, q: Queries, queue: str, paused: bool) -> bool:
    """Pause or resume a queue; whether it was paused before."""
    was: bool = await fetchval(conn, q, "queue_pause_set", queue=queue, paused=paused)
    return was


async def queue_list(conn: Conn, q: Queries, queue: str | None) -> list[Record]:
    """Queues with a setting (or the one named), by name."""
    return await fetch(conn, q, "queue_list", queue=queue)


async def queue_known(conn: Conn, q: Queries, queue: str) -> bool:
    """Whether ``queue`` has a setting or a live worker claims from it."""
    return bool(await fetchval(conn, q, "queue_known", queue=queue))


async def kind_limits_set(
    conn: Conn, q: Queries, kind: str, concurrency: int | None, rate: int | None, per: float | None
) -> None:
    """Replace a kind's limits (NULL: none)."""
    await execute(
        conn, q, "kind_limits_set", kind=kind, concurrency=concurrency, rate=rate, per=per
    )


async def kind_limits_list(conn: Conn, q: Queries) -> list[Record]:
    """Kinds with a limit, by name."""
    return await fetch(conn, q, "kind_limits_list")
