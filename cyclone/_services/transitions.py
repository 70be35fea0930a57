"""The transitions callers start, each inside one transaction: cancel, retry and signal a
run, fail the last attempt of a job or node, expire a wait node's timeout or a run's deadline,
wake a sleep node.

Every function here runs on a connection already in a transaction. Workflow transitions take
the run lock first (``run_lock_many``), so the statements after it see the run's current state
and transitions of one run never interleave; job transitions are single statements that lock
the task row before the run row (see the lock order in ``sql/README.md``). What they return is
what to publish after commit (:class:`Effects`).

How a run's graph then moves (nodes released, maps grown and settled, child runs' ends settled
on their parents) is in ``graph``. Callers name this module for every transition: it also
exports the graph's transitions that the insert path and the completer start themselves
(``advance``, ``expand_maps``, ``advance_completed``) and :class:`Effects`.
"""

from __future__ import annotations

import uuid

import asyncpg

from cyclone._model.errors import (
    CycloneError,
    DuplicateError,
    InvalidInputError,
    InvalidStateError,
    RunNotFoundError,
    UnknownNodeError,
)
from cyclone._model.events import Signal
from cyclone._model.states import NodeState, RunState
from cyclone._services.effects import Effects
from cyclone._services.graph import (
    advance,
    advance_completed,
    cancel_children,
    end_children,
    expand_maps,
    finish_waits,
    release,
    settle_items,
    wake_sleeps,
)
from cyclone._storage import queries as db
from cyclone._storage.loader import Queries

__all__ = [
    "Effects",
    "advance",
    "advance_completed",
    "cancel",
    "end_job",
    "expand_maps",
    "expire_deadline",
    "expire_wait",
    "fail_node_or_job",
    "is_job",
    "lock_run",
    "retry",
    "signal",
    "wake_sleep",
]


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
        if cancelled:  # its children with it; a child's own parent node settles
            effects = Effects.ending(run_id).merged(await cancel_children(conn, q, [run_id]))
            return True, await end_children(conn, q, effects)
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
    return await end_children(conn, q, effects.merged(await release(conn, q, run_id)))


async def signal(conn: db.Conn, q: Queries, run_id: uuid.UUID, sent: Signal) -> Effects:
    """Deliver a wait node's signal: checked against the node's declared type before any
    write, stored always, applied at once if the node is waiting."""
    workflow = None
    if sent.workflows:  # a typed wait node of that name is defined here: which is the run's?
        row = await db.run_kind(conn, q, run_id)
        if row is None:
            raise RunNotFoundError(run_id)
        workflow = row["name"]
    payload = sent.text(workflow)
    state = await lock_run(conn, q, run_id)
    if state in (RunState.COMPLETED, RunState.CANCELLED):
        raise InvalidStateError(f"run {run_id} is {state}; it takes no more signals")
    node_state = await db.wait_signal(conn, q, run_id, sent.node, payload, sent.event)
    if node_state is None:
        raise await _refused(conn, q, run_id, sent.node, sent.event)
    if node_state != NodeState.WAITING:
        return Effects()
    return await end_children(conn, q, await finish_waits(conn, q, [run_id], [sent.node]))


async def _refused(
    conn: db.Conn, q: Queries, run_id: uuid.UUID, node: str, event: str | None
) -> CycloneError:
    """Why wait_signal stored nothing."""
    step = await db.node_get(conn, q, run_id, node)
    where = f"node {node!r} of run {run_id}"
    if step is None:
        return UnknownNodeError(f"run {run_id} has no node {node!r}", node)
    if step["kind"] is not None:
        return InvalidStateError(f"{where} is a step, not a wait node")
    names = list(step["events"])
    if not names and event is not None:
        return InvalidInputError(f"wait {where} waits for one signal: leave event= out")
    if names and event not in names:
        given = "no event" if event is None else f"event {event!r}"
        return InvalidInputError(
            f"wait {where} waits for events {', '.join(map(repr, names))}, not {given}: "
            f'pass one as event="..."'
        )
    if step["took"] is not None:
        return InvalidStateError(
            f"wait {where} already took event {step['took']!r}: event {event!r} is refused"
        )
    if step["state"] == NodeState.COMPLETED and (names or not step["signalled"]):
        return InvalidStateError(f"wait {where} has completed: it takes no more signals")
    if event is not None:
        return InvalidStateError(f"event {event!r} of wait {where} already came")
    return InvalidStateError(f"wait {where} was already signalled")


async def fail_node_or_job(
    conn: db.Conn, q: Queries, attempt: db.LastAttempt, error: str, *, expired_only: bool
) -> tuple[bool, Effects]:
    """Fail an attempt that was the last: the job or node fails, and with it the run.

    Returns whether the attempt still owned its task (False: its completion is rejected).
    With ``expired_only`` (maintenance), only while the task's lease is still expired.
    """
    run_id = attempt.run_id
    if attempt.node is None:
        ended = await db.task_fail(conn, q, attempt, error, expired_only=expired_only)
        return ended is not None, Effects(ended={run_id} if ended is not None else set())
    await db.run_lock_many(conn, q, [run_id])
    failed = await db.task_fail(conn, q, attempt, error, expired_only=expired_only)
    if failed is None:
        return False, Effects()
    if failed["settles"]:  # an item of a map that settles all its items: the run goes on
        effects = await settle_items(conn, q, [run_id], [attempt.node])
    else:
        await db.run_fail(conn, q, run_id, error, drop_running=False)
        effects = Effects.ending(run_id)
    return True, await end_children(conn, q, effects)


async def expire_wait(
    conn: db.Conn, q: Queries, run_id: uuid.UUID, node: str, error: str
) -> Effects:
    """End a wait node whose timeout passed: completed with its ``on_timeout`` (the run
    goes on past it), else failed, and its run with it."""
    await db.run_lock_many(conn, q, [run_id])
    state = await db.wait_expire(conn, q, run_id, node, error)
    if state is None:
        return Effects()
    if state == NodeState.COMPLETED:
        return await end_children(conn, q, await advance(conn, q, [run_id], [node]))
    await db.run_fail(conn, q, run_id, error, drop_running=False)
    return await end_children(conn, q, Effects.ending(run_id))


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
    return await end_children(conn, q, Effects.ending(run_id))


async def wake_sleep(conn: db.Conn, q: Queries, run_id: uuid.UUID, node: str) -> Effects:
    """Complete a sleep node whose wake time has come, and advance past it: a run still
    pending releases the nodes after it; a failed one keeps them for a retry."""
    await db.run_lock_many(conn, q, [run_id])
    return await end_children(conn, q, await wake_sleeps(conn, q, [run_id], [node]))
