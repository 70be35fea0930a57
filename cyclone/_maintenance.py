"""Maintenance: the housekeeping every worker does on its own timer.

Each pass reclaims tasks whose lease expired (their worker died or stalled), fails last
attempts that expired, runs past their deadline and wait nodes past their timeout, reports
queue depth to observers and, with a client ``retention``, purges old terminal runs. Every
step is safe to run from many workers at once: each statement locks what it changes, skips
what another holds, and re-checks its condition under the lock.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from cyclone import _codec, _transitions
from cyclone import _queries as db

if TYPE_CHECKING:
    from cyclone._client import Client

logger = logging.getLogger("cyclone")

# Retention batches per pass: a large backlog drains over passes, never in one long go.
_PURGE_BATCHES_PER_PASS = 10


async def run_once(client: Client, *, worker_id: str, limit: int = 100) -> None:
    """One maintenance pass for ``client``'s schema."""
    log = {"worker": worker_id}
    effects = _transitions.Effects()
    try:
        async with client._acquire() as conn:
            await _expire(client, conn, effects, limit=limit, log=log)
    finally:  # what committed is announced even if a later step of the pass failed
        client._publish(effects.payloads())
    if client.observers.want_queue_stats:
        client.observers.queue_stats(await client.stats())
    if client.retention is not None:
        purged = await client._purge(
            client.retention.ages(), client.retention.batch, batches=_PURGE_BATCHES_PER_PASS
        )
        if purged:
            logger.info("cyclone: retention purged %d runs", purged, extra=log)


async def _expire(
    client: Client,
    conn: db.Conn,
    effects: _transitions.Effects,
    *,
    limit: int,
    log: dict[str, str],
) -> None:
    """Reclaim expired leases and fail what is overdue; gather what to announce in
    ``effects`` as each transaction commits."""
    q = client.queries
    reclaimed = await db.task_reclaim(conn, q, limit)
    if reclaimed:
        client.observers.reclaimed(len(reclaimed))
    for row in reclaimed:
        if row["queue"] is not None:  # None: parked, its run having failed
            effects.queues.add(row["queue"])
        logger.warning("cyclone: reclaimed task %s after its lease expired", row["id"], extra=log)
    for row in await db.task_expired_exhausted(conn, q, limit):
        error = _codec.encode_plain(
            {
                "attempt": row["attempt"],
                "type": "LeaseExpired",
                "message": f"the lease expired: worker {row['worker']} stopped renewing it",
            }
        )
        async with conn.transaction():
            _, more = await _transitions.fail_node_or_job(
                conn,
                q,
                task_id=row["id"],
                claims=row["claims"],
                run_id=row["run_id"],
                node=row["node"],
                error=error,
                expired_only=True,  # read without a lock: the lease may be renewed
            )
        effects.merge(more)
    await _expire_overdue(client, conn, effects, limit=limit)


async def expire_overdue(client: Client, *, limit: int = 100) -> None:
    """Fail the runs past their deadline and the wait nodes past their timeout, now: the
    scheduler's timer calls this when the first of them is due, between maintenance passes."""
    effects = _transitions.Effects()
    try:
        async with client._acquire() as conn:
            await _expire_overdue(client, conn, effects, limit=limit)
    finally:
        client._publish(effects.payloads())


async def _expire_overdue(
    client: Client, conn: db.Conn, effects: _transitions.Effects, *, limit: int
) -> None:
    q = client.queries
    for row in await db.run_deadline_due(conn, q, limit):
        error = _codec.encode_plain(
            {"type": "DeadlineExceeded", "message": "the run passed its deadline"}
        )
        async with conn.transaction():
            effects.merge(
                await _transitions.expire_deadline(conn, q, row["id"], error, job=row["job"])
            )
    for row in await db.wait_expire_due(conn, q, limit):
        error = _codec.encode_plain(
            {"type": "WaitTimeout", "message": f"wait node {row['node']!r} timed out"}
        )
        async with conn.transaction():
            effects.merge(
                await _transitions.expire_wait(conn, q, row["run_id"], row["node"], error)
            )
