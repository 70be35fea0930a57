"""Maintenance (``sql/maintenance.sql``): expired leases, wait timeouts, run deadlines,
retention, and the workers' presence rows."""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Sequence

from cyclone._storage.loader import Queries
from cyclone._storage.queries.conn import Conn, Record, execute, fetch, fetchval


async def task_reclaim(conn: Conn, q: Queries, limit: int) -> list[Record]:
    """Put tasks with expired leases and attempts left back to available."""
    return await fetch(conn, q, "task_reclaim", limit=limit)


async def task_rescue(conn: Conn, q: Queries, limit: int) -> list[Record]:
    """Put the tasks of lost workers with attempts left back to available."""
    return await fetch(conn, q, "task_rescue", limit=limit)


async def task_expired_exhausted(conn: Conn, q: Queries, limit: int) -> list[Record]:
    """Tasks whose lease expired on their last attempt."""
    return await fetch(conn, q, "task_expired_exhausted", limit=limit)


async def task_lost_exhausted(conn: Conn, q: Queries, limit: int) -> list[Record]:
    """The tasks of lost workers on their last attempt."""
    return await fetch(conn, q, "task_lost_exhausted", limit=limit)


async def workers_lost(conn: Conn, q: Queries) -> list[str]:
    """The workers whose liveness session ended."""
    return [r["id"] for r in await fetch(conn, q, "workers_lost")]


async def worker_twin(conn: Conn, q: Queries, worker: str, key: int) -> bool:
    """Whether another live worker, holding a liveness lock other than ``key``, runs as
    ``worker``."""
    twin: bool = await fetchval(conn, q, "worker_twin", worker=worker, key=key)
    return twin


async def worker_liveness_hold(conn: Conn, q: Queries, key: int) -> bool:
    """Take the liveness lock ``key`` on this session; False while another holds it."""
    held: bool = await fetchval(conn, q, "worker_liveness_hold", key=key)
    return held


async def wait_expire_due(conn: Conn, q: Queries, limit: int) -> list[Record]:
    """Wait nodes past their timeout."""
    return await fetch(conn, q, "wait_expire_due", limit=limit)


async def wait_expire(conn: Conn, q: Queries, run_id: uuid.UUID, node: str, error: str) -> bool:
    """Fail a wait node past its timeout; whether it was still waiting."""
    failed = await fetchval(conn, q, "wait_expire", run_id=run_id, node=node, error=error)
    return failed is not None


async def run_deadline_due(conn: Conn, q: Queries, limit: int) -> list[Record]:
    """Pending runs past their deadline: id, and whether each is a job."""
    return await fetch(conn, q, "run_deadline_due", limit=limit)


async def run_purge(
    conn: Conn, q: Queries, before: dt.datetime, states: Sequence[str], limit: int
) -> int:
    """Delete up to ``limit`` terminal runs; return how many."""
    count: int = await fetchval(conn, q, "run_purge", before=before, states=states, limit=limit)
    return count


async def worker_present(
    conn: Conn,
    q: Queries,
    worker: str,
    host: str,
    pid: int,
    queues: Sequence[str],
    kinds: Sequence[str],
    workflows: Sequence[str],
    ttl: float,
    liveness: int | None,
) -> None:
    """Record ``worker`` as live for ``ttl`` seconds with what it claims and the liveness
    lock its session holds (None: none); sweep expired rows."""
    await execute(
        conn,
        q,
        "worker_present",
        worker=worker,
        host=host,
        pid=pid,
        queues=queues,
        kinds=kinds,
        workflows=workflows,
        ttl=ttl,
        liveness=liveness,
    )


async def worker_leave(conn: Conn, q: Queries, worker: str) -> None:
    """Remove ``worker``'s presence row."""
    await execute(conn, q, "worker_leave", worker=worker)


async def worker_list(conn: Conn, q: Queries) -> list[Record]:
    """The live workers' presence rows, newest first."""
    return await fetch(conn, q, "worker_list")
