"""Maintenance: the housekeeping every worker does on its own timer.

Each pass reclaims tasks whose lease expired (their worker died or stalled) or whose
worker's liveness session ended (presence.py), fails such last attempts, runs past their
deadline and wait nodes past their timeout, wakes sleep nodes whose wake time came, ends the
jobs not started by their expiry and purges old terminal runs: with the client's
``retention`` those of every name without one of its own (the names in
``cyclone_retention``), and those of the kinds and workflows this worker defines with one of
their own by their own ages. Each pass records those names' retentions there first, so a
worker that does not know a name leaves it alone. The rescue probe runs the reclaiming part
at once when it sees a worker lost. Every step is safe to run from many workers at once:
each statement locks what it changes, skips what another holds, and re-checks its condition
under the lock.
"""

from __future__ import annotations

import logging
import math
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from cyclone._model import codec
from cyclone._model.retention import Retention, Retentions
from cyclone._services import transitions
from cyclone._services.bundle import Services
from cyclone._storage import queries as db
from cyclone._worker.outcomes import describe_attempt

if TYPE_CHECKING:
    from cyclone._model.steps import Step
    from cyclone._model.workflows import Workflow

logger = logging.getLogger("cyclone")

# Retention batches per pass: a large backlog drains over passes, never in one long go.
_PURGE_BATCHES_PER_PASS = 10
# Expired jobs ended per statement, and statements per pass.
_EXPIRE_BATCH = 1000
_EXPIRE_BATCHES_PER_PASS = 10
DECLARE_EVERY = 60.0  # seconds between a worker's records of its names' own retentions


class Retaining:
    """What a worker's passes purge by (``retentions``), and when they next record its
    names' own retentions in cyclone_retention: at its first pass, then every
    ``DECLARE_EVERY`` seconds (its definitions do not change while it runs; the repeat
    undoes a rolling deploy's older workers recording the opposite)."""

    def __init__(self, retentions: Retentions) -> None:
        self.retentions = retentions
        self._declare_at = -math.inf

    def declare_due(self) -> bool:
        """Whether this pass records the names' retentions (and the next in a while)."""
        now = time.monotonic()
        if now < self._declare_at:
            return False
        self._declare_at = now + DECLARE_EVERY
        return True


async def run_once(
    services: Services, retaining: Retaining, *, worker_id: str, limit: int = 100
) -> None:
    """One maintenance pass for the schema of ``services``, purging as ``retaining`` says."""
    log = {"worker": worker_id}
    effects = transitions.Effects()
    try:
        async with services.database.acquire() as conn:
            await _Pass(services, conn, effects, limit, log).expire()
    finally:  # what committed is announced even if a later step of the pass failed
        services.publisher.publish(effects.payloads())
    retentions = retaining.retentions
    if (retentions.own or retentions.known) and retaining.declare_due():
        async with services.database.acquire() as conn:
            await db.retention_declare(
                conn,
                services.database.queries,
                [(name, r.seconds()) for name, r in sorted(retentions.own.items())],
                retentions.known,
            )
    purged = 0
    if retentions.client is not None:
        purged += await _purge(services, retentions.client, names=None)
    for name, own in sorted(retentions.own.items()):
        purged += await _purge(services, own, names=[name])
    if purged:
        logger.info("worker %s: retention purged %d runs", worker_id, purged, extra=log)


async def _purge(services: Services, retention: Retention, *, names: list[str] | None) -> int:
    """Purge by ``retention``: runs of ``names``, or (None) of every name without a
    retention of its own."""
    return await services.runs.purge(
        retention.ages(),
        retention.batch,
        batches=_PURGE_BATCHES_PER_PASS,
        names=names,
        others=names is None,
    )


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
    """Fail the runs past their deadline and the wait nodes past their timeout, and wake
    the sleep nodes whose wake time came, now: the scheduler's timer calls this when the
    first of them is due, between maintenance passes."""
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
        """Fail the runs past their deadline and the wait nodes past their timeout; wake the
        sleep nodes whose wake time came; end the jobs not started by their expiry."""
        conn, q = self.conn, self.services.database.queries
        await self.expire_jobs()
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
            if row["sleep"]:  # a sleep node's wake time came: it completes
                async with self.services.database.transaction(conn):
                    self.effects.merge(
                        await transitions.wake_sleep(conn, q, row["run_id"], row["node"])
                    )
                continue
            error = codec.encode_plain(
                {"type": "WaitTimeout", "message": f"wait node {row['node']!r} timed out"}
            )
            async with self.services.database.transaction(conn):
                ended = await transitions.expire_wait(conn, q, row["run_id"], row["node"], error)
            self.effects.merge(ended)
            if ended.ended:
                logger.warning(
                    "wait node %r of run %s timed out without a signal: the run ended (failed, "
                    "or completed through its on_timeout)",
                    row["node"],
                    row["run_id"],
                    extra={"run_id": str(row["run_id"]), "node": row["node"], **self.log},
                )

    async def expire_jobs(self) -> None:
        """End the jobs not started by their expiry, in batches: claims pass expired tasks
        by one at a time, so a backlog of them is to go quickly."""
        conn, q = self.conn, self.services.database.queries
        for _ in range(_EXPIRE_BATCHES_PER_PASS):
            rows = await db.job_expire(conn, q, _EXPIRE_BATCH)
            for row in rows:
                self.effects.ended.add(row["run_id"])
                if row["sequenced"]:  # the next job of its sequence may start now
                    self.effects.queues.add(row["queue"])
                logger.debug(
                    "job %s (kind %s) was not started by its expiry: it ends expired",
                    row["run_id"],
                    row["kind"],
                    extra={"run_id": str(row["run_id"]), "kind": row["kind"], **self.log},
                )
            for kind, count in sorted(Counter(row["kind"] for row in rows).items()):
                logger.info(
                    "%d job(s) of kind %s were not started by their expiry: they end expired "
                    "without running",
                    count,
                    kind,
                    extra={"kind": kind, "count": count, **self.log},
                )
            if len(rows) < _EXPIRE_BATCH:
                return


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


def retentions(
    client: Retention | None,
    steps: Mapping[str, Step[Any, Any]],
    workflows: Mapping[str, Workflow[Any]],
) -> Retentions:
    """The retentions a worker with these ``steps`` and ``workflows`` applies: the client's,
    and those the steps and workflows declare (``retention=``)."""
    own: dict[str, Retention] = {
        name: s.retention for name, s in steps.items() if s.retention is not None
    }
    own.update((name, wf.retention) for name, wf in workflows.items() if wf.retention is not None)
    return Retentions(client, own, tuple(sorted({*steps, *workflows})))
