"""Run and node transitions that span several statements, each inside one transaction.

Every function here runs on a connection already in a transaction. Workflow transitions take
the run lock first (``run_lock_many``), so the statements after it see the run's current state
and transitions of one run never interleave; job transitions are single statements that lock
the task row before the run row (see the lock order in ``sql/README.md``). What they return is
what to publish after commit.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field

import asyncpg

from cyclone._model.errors import (
    DuplicateError,
    InvalidStateError,
    RunNotFoundError,
    UnknownNodeError,
)
from cyclone._model.states import NodeState, RunState
from cyclone._services.notifier import queue_payload, run_payloads
from cyclone._storage import queries as db
from cyclone._storage.loader import Queries


@dataclass(slots=True)
class Effects:
    """What a committed transition should announce: queues with new work, runs that ended."""

    queues: set[str] = field(default_factory=set)
    ended: set[uuid.UUID] = field(default_factory=set)

    def merge(self, other: Effects) -> None:
        """Add ``other``'s announcements to these."""
        self.queues |= other.queues
        self.ended |= other.ended

    def payloads(self) -> list[str]:
        """NOTIFY payloads for these announcements."""
        return [queue_payload(q) for q in sorted(self.queues)] + run_payloads(self.ended)


async def advance(
    conn: db.Conn, q: Queries, run_ids: Sequence[uuid.UUID], nodes: Sequence[str]
) -> Effects:
    """Advance the DAG after ``nodes`` completed (runs locked by the caller).

    A wait node whose signal arrived before it was reachable completes as soon as it is
    reached, which can release further nodes (see :func:`finish_waits`).
    """
    effects = Effects()
    if not run_ids:
        return effects
    signalled_runs, signalled_nodes = [], []
    for row in await db.node_advance(conn, q, run_ids, nodes):
        if row["what"] == "queue":
            effects.queues.add(row["value"])
        elif row["what"] == "ended":
            effects.ended.add(row["run_id"])
        else:
            signalled_runs.append(row["run_id"])
            signalled_nodes.append(row["node"])
    if signalled_runs:
        effects.merge(await finish_waits(conn, q, signalled_runs, signalled_nodes))
    return effects


async def finish_waits(
    conn: db.Conn, q: Queries, run_ids: Sequence[uuid.UUID], nodes: Sequence[str]
) -> Effects:
    """Complete reachable wait nodes that have their signal, and advance past them (runs
    locked by the caller)."""
    finished = await db.wait_complete_many(conn, q, run_ids, nodes)
    return await advance(conn, q, [r["run_id"] for r in finished], [r["node"] for r in finished])


async def lock_run(conn: db.Conn, q: Queries, run_id: uuid.UUID) -> str:
    """Lock one run; return its stored state, or raise :class:`RunNotFoundError`."""
    states = await db.run_lock_many(conn, q, [run_id])
    if run_id not in states:
        raise RunNotFoundError(run_id)
    return states[run_id]


async def is_job(conn: db.Conn, q: Queries, run_id: uuid.UUID) -> bool:
    """Whether the run is a standalone job; :class:`RunNotFoundError` if it is not visible."""
    row = await db.run_kind(conn, q, run_id)
    if row is None:
        raise RunNotFoundError(run_id)
    return bool(row["job"])


async def end_job(
    conn: db.Conn, q: Queries, run_id: uuid.UUID, state: RunState, error: str | None
) -> bool:
    """Cancel a job, or fail it past its deadline (in the caller's transaction); whether this
    call ended it."""
    await db.job_lock(conn, q, run_id)
    return await db.job_end(conn, q, run_id, state, error)


async def cancel(conn: db.Conn, q: Queries, run_id: uuid.UUID) -> tuple[bool, Effects]:
    """Cancel a run; whether this call cancelled it."""
    if await is_job(conn, q, run_id):
        cancelled = await end_job(conn, q, run_id, RunState.CANCELLED, None)
    else:
        await lock_run(conn, q, run_id)
        cancelled = await db.run_cancel(conn, q, run_id)
    return cancelled, Effects(ended={run_id} if cancelled else set())


async def retry(conn: db.Conn, q: Queries, run_id: uuid.UUID, node: str | None) -> Effects:
    """Re-open a failed run, or reset one of its failed nodes."""
    effects = Effects()
    kind = await db.run_kind(conn, q, run_id)
    if kind is None:
        raise RunNotFoundError(run_id)
    if kind["job"]:
        if node is not None and node != kind["name"]:  # a job's one node is named by its kind
            raise UnknownNodeError(f"run {run_id} has no node {node!r}", node)
        try:
            async with conn.transaction():  # a savepoint: the look-up below needs the tx
                queue = await db.job_reopen(conn, q, run_id)
        except asyncpg.UniqueViolationError:
            # A newer active run of the kind took the failed job's unique= key meanwhile.
            row = await db.run_unique_holder(conn, q, run_id)
            raise DuplicateError(row["name"], row["unique_key"], row["holder"]) from None
        if queue is None:
            state = (await db.run_kind(conn, q, run_id) or {"state": "gone"})["state"]
            raise InvalidStateError(f"run {run_id} is {state}; only a failed run can be retried")
        effects.queues.add(queue)
        return effects
    state = await lock_run(conn, q, run_id)
    if state != RunState.FAILED:
        raise InvalidStateError(f"run {run_id} is {state}; only a failed run can be retried")
    reopened = await db.run_reopen(conn, q, run_id, node)
    if node is not None and reopened["reset"] == 0:
        if await db.node_get(conn, q, run_id, node) is None:
            raise UnknownNodeError(f"run {run_id} has no node {node!r}", node)
        raise InvalidStateError(f"node {node!r} of run {run_id} has not failed")
    if not reopened["reopened"]:
        return effects  # another failed node keeps the run failed; this one was reset
    signalled = []
    for row in await db.run_release(conn, q, run_id):
        if not row["wait"]:
            effects.queues.add(row["queue"])
        elif row["signalled"]:
            signalled.append(row["node"])
    if signalled:
        effects.merge(await finish_waits(conn, q, [run_id] * len(signalled), signalled))
    return effects


async def signal(conn: db.Conn, q: Queries, run_id: uuid.UUID, node: str, payload: str) -> Effects:
    """Deliver a wait node's signal: stored always, applied at once if the node is waiting."""
    state = await lock_run(conn, q, run_id)
    if state in (RunState.COMPLETED, RunState.CANCELLED):
        raise InvalidStateError(f"run {run_id} is {state}; it takes no more signals")
    node_state = await db.wait_signal(conn, q, run_id, node, payload)
    if node_state is None:
        step = await db.node_get(conn, q, run_id, node)
        if step is None:
            raise UnknownNodeError(f"run {run_id} has no node {node!r}", node)
        if step["kind"] is not None:
            raise InvalidStateError(f"node {node!r} of run {run_id} is a step, not a wait node")
        raise InvalidStateError(f"wait node {node!r} of run {run_id} was already signalled")
    if node_state != NodeState.WAITING:
        return Effects()
    return await finish_waits(conn, q, [run_id], [node])


async def fail_node_or_job(
    conn: db.Conn, q: Queries, attempt: db.LastAttempt, error: str, *, expired_only: bool
) -> tuple[bool, Effects]:
    """Fail an attempt that was the last: the job or node fails, and with it the run.

    Returns whether the attempt still owned its task (False: its completion is rejected).
    With ``expired_only`` (maintenance), only while the task's lease is still expired.
    """
    run_id = attempt.run_id
    if attempt.node is None:
        failed = await db.task_fail(conn, q, attempt, error, expired_only=expired_only)
        return failed, Effects(ended={run_id} if failed else set())
    await db.run_lock_many(conn, q, [run_id])
    if not await db.task_fail(conn, q, attempt, error, expired_only=expired_only):
        return False, Effects()
    await db.run_fail(conn, q, run_id, error, drop_running=False)
    return True, Effects(ended={run_id})


async def expire_wait(
    conn: db.Conn, q: Queries, run_id: uuid.UUID, node: str, error: str
) -> Effects:
    """Fail a wait node whose timeout passed, and its run."""
    await db.run_lock_many(conn, q, [run_id])
    if not await db.wait_expire(conn, q, run_id, node, error):
        return Effects()
    await db.run_fail(conn, q, run_id, error, drop_running=False)
    return Effects(ended={run_id})


async def expire_deadline(
    conn: db.Conn, q: Queries, run_id: uuid.UUID, error: str, *, job: bool
) -> Effects:
    """Fail a run past its deadline; its running handlers stop at their next heartbeat."""
    if job:
        failed = await end_job(conn, q, run_id, RunState.FAILED, error)
        return Effects(ended={run_id} if failed else set())
    states = await db.run_lock_many(conn, q, [run_id])
    if states.get(run_id) != RunState.PENDING:
        return Effects()
    await db.run_fail(conn, q, run_id, error, drop_running=True)
    return Effects(ended={run_id})
