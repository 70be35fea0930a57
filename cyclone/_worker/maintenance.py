"""Maintenance: the housekeeping every worker does on its own timer.

Each pass reclaims tasks whose lease expired (their worker died or stalled) or whose
worker's liveness session ended (presence.py), fails such last attempts, runs past their
deadline and wait nodes past their timeout and, with a client ``retention``, purges old
terminal runs. The rescue probe runs the reclaiming part at once when it sees a worker lost. Every
step is safe to run from many workers at once: each statement locks what it changes, skips
what another holds, and re-checks its condition under the lock.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from cyclone._model import codec
from cyclone._services import transitions
from cyclone._services.bundle import Services
from cyclone._services.runs import Retention
from cyclone._storage import queries as db
from cyclone._worker.outcomes import describe_attempt

logger = logging.getLogger("cyclone")

# Retention batches per pass: a large backlog drains over passes, never in one long go.
_PURGE_BATCHES_PER_PASS = 10


async def run_once(
    services: Services, retention: Retention | None, *, worker_id: str, limit: int = 100
) -> None:
    """One maintenance pass for the schema of ``services``; with a ``retention``, purge."""
    log = {"worker": worker_id}
    effects = transitions.Effects()
    try:
        async with services.database.acquire() as conn:
            await _Pass(services, conn, effects, limit, log).expire()
    finally:  # what committed is announced even if a later step of the pass failed
        services.publisher.publish(effects.payloads())
    if retention is not None:
        purged = await services.runs.purge(
            retention.ages(), retention.batch, batches=_PURGE_BATCHES_PER_PASS
        )
        if purged:
            logger.info("worker %s: retention purged %d runs", worker_id, purged, extra=log)


async def rescue(
    services: Services, *, worker_id: str, dead: Sequence[str] = (), limit: int = 100
) -> None:
    """Release the tasks of lost workers now: the rescue probe found a worker whose lock
    stayed free past its grace, or whose process is gone (``dead``)."""
    effects = transitions.Effects()
    try:
        async with services.database.acquire() as conn:
            await _Pass(services, conn, effects, limit, {"worker": worker_id}).reclaim(
                lost=True, dead=dead
            )
    finally:
        services.publisher.publish(effects.payloads())


async def expire_overdue(services: Services, *, worker_id: str, limit: int = 100) -> None:
    """Fail the runs past their deadline and the wait nodes past their timeout, now: the
    scheduler's timer calls this when the first of them is due, between maintenance passes."""
    effects = transitions.Effects()
    log = {"worker": worker_id}
    try:
        async with services.database.acquire() as conn:
            await _Pass(services, conn, effects, limit, log).expire_overdue()
    finally:
        services.publisher.publish(effects.payloads())


@dataclass(frozen=True)
class _Pass:
    """One pass on ``conn``, at most ``limit`` rows a step, logging with the ``log`` fields;
    what each of its transactions changes is gathered in ``effects`` to announce."""

    services: Services
    conn: db.Conn
    effects: transitions.Effects
    limit: int
    log: dict[str, str]

    async def expire(self) -> None:
        """Reclaim expired leases and lost workers' tasks, and fail what is overdue."""
        await self.reclaim(lost=False)
        if await db.workers_lost(self.conn, self.services.database.queries):  # rarely any
            await self.reclaim(lost=True)
        await self.expire_overdue()

    async def reclaim(self, *, lost: bool, dead: Sequence[str] = ()) -> None:
        """Release the tasks of lost workers (``lost``: those past their grace, and those
        in ``dead``) or of expired leases; fail those on their last attempt."""
        conn, q, by = self.conn, self.services.database.queries, self.log["worker"]
        if lost:
            reclaimed = await db.task_rescue(conn, q, self.limit, dead=dead, by=by)
        else:
            reclaimed = await db.task_reclaim(conn, q, self.limit, by=by)
        if reclaimed:
            self.services.observers.reclaimed(len(reclaimed))
            self.services.observers.released(
                "worker_lost" if lost else "lease_expired", len(reclaimed)
            )
        for row in reclaimed:
            if row["queue"] is not None:  # None: parked, its run having failed
                self.effects.queues.add(row["queue"])
            logger.warning(
                "%s: %s; %s",
                _attempt(row),
                _why(row["lost_by"], lost=not row["timed_out"]),
                "it is available again" if row["queue"] else "parked, its run having failed",
                extra={**_fields(row), **self.log},
            )
        if lost:
            exhausted = await db.task_lost_exhausted(conn, q, self.limit, dead=dead, by=by)
        else:
            exhausted = await db.task_expired_exhausted(conn, q, self.limit, by=by)
        for row in exhausted:
            why = _why(row["worker"], lost=lost)
            error = codec.encode_plain(
                {
                    "attempt": row["attempt"],
                    "type": "WorkerLost" if lost else "LeaseExpired",
                    "reason": "worker_lost" if lost else "lease_expired",
                    "message": _message(row["worker"], lost=lost),
                    **codec.decode(row["evidence"], dict[str, Any]),
                }
            )
            async with self.services.database.transaction(conn):
                owned, more = await transitions.fail_node_or_job(
                    conn,
                    q,
                    db.TaskAttempt.of(row),
                    error,
                    # Read without a lock: the lease may be renewed meanwhile. A lost
                    # worker's attempt goes by its fence alone (its lease has not run out).
                    expired_only=not lost,
                )
            self.effects.merge(more)
            if not owned:  # renewed or handled meanwhile
                continue
            # Released as well, though into a failure: counted with the others.
            self.services.observers.released("worker_lost" if lost else "lease_expired", 1)
            logger.error(
                "%s: %s; no attempts left, so the run fails",
                _attempt(row),
                why,
                extra={**_fields(row), **self.log},
            )

    async def expire_overdue(self) -> None:
        """Fail the runs past their deadline and the wait nodes past their timeout."""
        conn, q = self.conn, self.services.database.queries
        for row in await db.run_deadline_due(conn, q, self.limit):
            error = codec.encode_plain(
                {"type": "DeadlineExceeded", "message": "the run passed its deadline"}
            )
            async with self.services.database.transaction(conn):
                ended = await transitions.expire_deadline(conn, q, row["id"], error, job=row["job"])
            self.effects.merge(ended)
            if ended.ended:
                logger.warning(
                    "run %s passed its run_deadline: it fails",
                    row["id"],
                    extra={"run_id": str(row["id"]), **self.log},
                )
        for row in await db.wait_expire_due(conn, q, self.limit):
            error = codec.encode_plain(
                {"type": "WaitTimeout", "message": f"wait node {row['node']!r} timed out"}
            )
            async with self.services.database.transaction(conn):
                ended = await transitions.expire_wait(conn, q, row["run_id"], row["node"], error)
            self.effects.merge(ended)
            if ended.ended:
                logger.warning(
                    "wait node %r of run %s timed out without a signal: the run fails",
                    row["node"],
                    row["run_id"],
                    extra={"run_id": str(row["run_id"]), "node": row["node"], **self.log},
                )


def _message(worker: str | None, *, lost: bool) -> str:
    """The message of a released attempt's error (as task_reclaim and task_rescue write it)."""
    if lost:
        return (
            f"worker {worker} was lost: its session with the database ended (the process "
            "died, or stayed cut off past its grace)"
        )
    return f"the lease expired: worker {worker} stopped renewing it"


def _why(worker: str | None, *, lost: bool) -> str:
    """Why maintenance took an attempt's task back, as its log line says (the error's
    message, written by the statement, says the same)."""
    if lost:
        return (
            f"its worker {worker} was lost (its session with the database ended: the process "
            "died, or stayed cut off past its grace)"
        )
    return f"its lease expired (worker {worker} stopped renewing it)"


def _attempt(row: db.Record) -> str:
    return describe_attempt(
        row["attempt"], row["max_attempts"], row["kind"], row["run_id"], row["node"]
    )


def _fields(row: db.Record) -> dict[str, object]:
    """The log fields of an attempt found by maintenance (``worker`` is the one doing it)."""
    return {
        "run_id": str(row["run_id"]),
        "kind": row["kind"],
        "node": row["node"],
        "attempt": row["attempt"],
        "max_attempts": row["max_attempts"],
        "queue": row["queue"],
    }
