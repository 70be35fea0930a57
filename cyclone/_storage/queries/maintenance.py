"""Maintenance (``sql/maintenance.sql``): expired leases, wait timeouts, run deadlines,
retention, and the workers' presence rows."""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Sequence

from cyclone._storage.loader import Queries
from cyclone._storage.queries.conn import Conn, Record, execute, fetch, fetchrow, fetchval


async def task_reclaim(
    conn: Conn, q: Queries, limit: int, *, by: str | None = None
) -> list[Record]:
    """Put tasks with expired leases and attempts left back to available; ``by`` is the
    worker doing it, recorded with each attempt's error."""
    return await fetch(conn, q, "task_reclaim", limit=limit, by=by)


async def task_rescue(
    conn: Conn, q: Queries, limit: int, *, dead: Sequence[str] = (), by: str | None = None
) -> list[Record]:
    """Put the tasks of lost workers with attempts left back to available: those whose lock
    stayed free past their grace, and those in ``dead`` (known gone) whose lock is free."""
    return await fetch(conn, q, "task_rescue", limit=limit, dead=list(dead), by=by)


async def task_expired_exhausted(
    conn: Conn, q: Queries, limit: int, *, by: str | None = None
) -> list[Record]:
    """Tasks whose lease expired on their last attempt, with the evidence of each."""
    return await fetch(conn, q, "task_expired_exhausted", limit=limit, by=by)


async def task_lost_exhausted(
    conn: Conn, q: Queries, limit: int, *, dead: Sequence[str] = (), by: str | None = None
) -> list[Record]:
    """The tasks of lost workers on their last attempt, with the evidence of each."""
    return await fetch(conn, q, "task_lost_exhausted", limit=limit, dead=list(dead), by=by)


async def workers_lost(conn: Conn, q: Queries, dead: Sequence[str] = ()) -> list[str]:
    """The workers taken for dead: their lock stayed free past their grace, or they are in
    ``dead`` and their lock is free."""
    return [r["id"] for r in await fetch(conn, q, "workers_lost", dead=list(dead))]


async def workers_unlocked(conn: Conn, q: Queries) -> list[Record]:
    """The live workers whose liveness lock is free now (noting since when): id, machine,
    pid, grace, lock_free_since, and the database's now."""
    return await fetch(conn, q, "workers_unlocked")


async def worker_twin(conn: Conn, q: Queries, worker: str, key: int) -> bool:
    """Whether another live worker, holding a liveness lock other than ``key``, runs as
    ``worker``."""
    twin: bool = await fetchval(conn, q, "worker_twin", worker=worker, key=key)
    return twin


async def worker_liveness_hold(conn: Conn, q: Queries, key: int) -> bool:
    """Take the liveness lock ``key`` on this session; False while another holds it."""
    held: bool = await fetchval(conn, q, "worker_liveness_hold", key=key)
    return held


async def worker_relock(conn: Conn, q: Queries, worker: str, key: int) -> Record:
    """Take ``worker``'s liveness lock ``key`` again on this session: ok, and the release
    of its tasks by a peer while it was without (released_at, released_by), if any."""
    row = await fetchrow(conn, q, "worker_relock", worker=worker, key=key)
    assert row is not None
    return row


async def worker_alive(conn: Conn, q: Queries, worker: str, key: int) -> None:
    """Say that ``worker`` lives though its liveness lock ``key`` is free for now."""
    await execute(conn, q, "worker_alive", worker=worker, key=key)


async def wait_expire_due(conn: Conn, q: Queries, limit: int) -> list[Record]:
    """Wait nodes past their timeout."""
    return await fetch(conn, q, "wait_expire_due", limit=limit)


async def wait_expire(
    conn: Conn, q: Queries, run_id: uuid.UUID, node: str, error: str
) -> str | None:
    """End a wait node past its timeout (completed by its ``on_timeout``, else failed); its
    new state, or None if it was no longer waiting."""
    state: str | None = await fetchval(
        conn, q, "wait_expire", run_id=run_id, node=node, error=error
    )
    return state


async def run_deadline_due(conn: Conn, q: Queries, limit: int) -> list[Record]:
    """Pending runs past their deadline: id, and whether each is a job."""
    return await fetch(conn, q, "run_deadline_due", limit=limit)


async def run_purge(
    conn: Conn,
    q: Queries,
    before: dt.datetime,
    states: Sequence[str],
    limit: int,
    *,
    names: Sequence[str] | None = None,
    others: bool = False,
) -> int:
    """Delete up to ``limit`` terminal runs (of ``names``, or any; with ``others``, only of
    names without a retention of their own); return how many."""
    count: int = await fetchval(
        conn,
        q,
        "run_purge",
        before=before,
        states=states,
        names=None if names is None else list(names),
        others=others,
        limit=limit,
    )
    return count


async def job_expire(conn: Conn, q: Queries, limit: int) -> list[Record]:
    """End up to ``limit`` jobs not started by their expiry: (run_id, kind, queue,
    sequenced) of each."""
    return await fetch(conn, q, "job_expire", limit=limit)


async def retention_declare(
    conn: Conn,
    q: Queries,
    ages: Sequence[tuple[str, Sequence[float | None]]],
    known: Sequence[str],
) -> None:
    """Record each name's own retention (its completed, failed, cancelled and expired ages
    in seconds, None: forever); forget those of the ``known`` names not among them."""
    columns: list[list[float | None]] = [[], [], [], []]
    for _, four in ages:
        for column, age in zip(columns, four, strict=True):
            column.append(age)
    completed, failed, cancelled, expired = columns
    await execute(
        conn,
        q,
        "retention_declare",
        names=[name for name, _ in ages],
        completed=completed,
        failed=failed,
        cancelled=cancelled,
        expired=expired,
        known=list(known),
    )


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
    *,
    backend: int | None = None,
    machine: str | None = None,
    grace: float | None = None,
) -> None:
    """Record ``worker`` as live for ``ttl`` seconds with what it claims, the liveness lock
    its session holds (None: none), that session's ``backend``, the ``machine`` its pid is
    a process of and its ``grace``; sweep expired rows."""
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
        backend=backend,
        machine=machine,
        grace=grace,
    )


async def worker_leave(conn: Conn, q: Queries, worker: str) -> None:
    """Remove ``worker``'s presence row."""
    await execute(conn, q, "worker_leave", worker=worker)


async def worker_list(conn: Conn, q: Queries) -> list[Record]:
    """The live workers' presence rows, newest first."""
    return await fetch(conn, q, "worker_list")
