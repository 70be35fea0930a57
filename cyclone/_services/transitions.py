"""Run and node transitions that span several statements, each inside one transaction.

Every function here runs on a connection already in a transaction. Workflow transitions take
the run lock first (``run_lock_many``), so the statements after it see the run's current state
and transitions of one run never interleave; job transitions are single statements that lock
the task row before the run row (see the lock order in ``sql/README.md``). What they return is
what to publish after commit.
"""

from __future__ import annotations

import datetime as dt
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
    # Runs that ended and are (or may be) child runs, whose parent nodes end_children settles
    # before the transition commits: not announced.
    children: set[uuid.UUID] = field(default_factory=set)

    @classmethod
    def ending(cls, run_id: uuid.UUID) -> Effects:
        """The effects of a run that ended outside node_advance (failed or cancelled), which
        may be a child run."""
        return cls(ended={run_id}, children={run_id})

    def merge(self, other: Effects) -> None:
        """Add ``other``'s announcements to these."""
        self.queues |= other.queues
        self.ended |= other.ended
        self.children |= other.children

    def merged(self, other: Effects) -> Effects:
        """These announcements with ``other``'s added."""
        self.merge(other)
        return self

    def payloads(self) -> list[str]:
        """NOTIFY payloads for these announcements."""
        return [queue_payload(q) for q in sorted(self.queues)] + run_payloads(self.ended)


async def advance(
    conn: db.Conn,
    q: Queries,
    run_ids: Sequence[uuid.UUID],
    nodes: Sequence[str],
    *,
    skipped: Sequence[bool] | None = None,
) -> Effects:
    """Advance the DAG after ``nodes`` completed (or were ``skipped``; runs locked by the
    caller), until nothing more moves in this transaction.

    Releasing a node can settle others at once, each of which is advanced past in turn: a
    wait node whose signal arrived before it was reachable completes, a map node grows its
    item nodes (completing at once over an empty list), and a node whose branch was not taken
    is skipped.
    """
    effects = Effects()
    flags = [False] * len(nodes) if skipped is None else list(skipped)
    done = _Done(list(run_ids), list(nodes), flags)
    while done.run_ids:
        rows = await db.node_advance(conn, q, done.run_ids, done.nodes, done.skipped)
        done = await _released(conn, q, rows, effects)
    return effects


async def _released(
    conn: db.Conn, q: Queries, rows: Sequence[db.Record], effects: Effects
) -> _Done:
    """Act on what released nodes became (``rows`` of node_advance or run_release: what,
    value, run_id, node), adding what to announce to ``effects``; returns the nodes that
    settled at once, to advance past next."""
    settled, signalled, maps = _Done(), _Done(), _Done()
    for row in rows:
        what = row["what"]
        if what == "queue":
            effects.queues.add(row["value"])
        elif what == "ended":
            effects.ended.add(row["run_id"])
            if row["node"] == "child":
                effects.children.add(row["run_id"])
        elif what == "skipped":
            settled.add(row["run_id"], row["node"], skipped=True)
        elif what == "map":
            maps.add(row["run_id"], row["node"], skipped=False)
        elif what == "signalled":
            signalled.add(row["run_id"], row["node"], skipped=False)
    if signalled.run_ids:
        finished = await db.wait_complete_many(conn, q, signalled.run_ids, signalled.nodes)
        settled.add_all([r["run_id"] for r in finished], [r["node"] for r in finished])
    if maps.run_ids:
        settled.extend(await expand_maps(conn, q, maps.run_ids, maps.nodes, effects))
    return settled


async def expand_maps(
    conn: db.Conn,
    q: Queries,
    run_ids: Sequence[uuid.UUID],
    nodes: Sequence[str],
    effects: Effects,
    available_at: dt.datetime | None = None,
) -> _Done:
    """Grow the item nodes of reached map nodes (runs locked by the caller), their tasks
    claimable from ``available_at`` (None: now), adding what to announce to ``effects``;
    returns the map nodes that completed at once (over an empty list), for the caller to
    advance past. A map node given too many items fails its run."""
    completed = _Done()
    for row in await db.map_expand(conn, q, run_ids, nodes, available_at):
        what = row["what"]
        if what == "queue":
            effects.queues.add(row["value"])
        elif what == "completed":
            completed.add(row["run_id"], row["node"], skipped=False)
        else:  # failed: the list was too long, or not a list
            await db.run_fail(conn, q, row["run_id"], row["value"], drop_running=False)
            effects.merge(Effects.ending(row["run_id"]))
    return completed


async def settle_items(
    conn: db.Conn, q: Queries, run_ids: Sequence[uuid.UUID], nodes: Sequence[str]
) -> Effects:
    """Count settled item nodes down on their map nodes (runs locked by the caller): the
    next items are released, and a map node whose items are all settled completes and is
    advanced past."""
    effects = Effects()
    completed = _Done()
    for row in await db.map_settle(conn, q, run_ids, nodes):
        if row["what"] == "queue":
            effects.queues.add(row["value"])
        else:
            completed.add(row["run_id"], row["node"], skipped=False)
    if completed.run_ids:
        effects.merge(await advance(conn, q, completed.run_ids, completed.nodes))
    return effects


async def advance_completed(
    conn: db.Conn, q: Queries, rows: Sequence[db.Record], children: Sequence[uuid.UUID] = ()
) -> Effects:
    """Advance past nodes that ``node_complete_many`` completed (``rows``: run_id, node,
    map_of, child): an item node settles on its map node, a child node waits for its child
    run (of ``children``, the runs the caller submitted for them: settled at once if one
    already ended), any other node releases its children."""
    nodes, items = _Done(), _Done()
    for r in rows:
        if not r["child"]:
            (nodes if r["map_of"] is None else items).add(r["run_id"], r["node"], skipped=False)
    effects = await advance(conn, q, nodes.run_ids, nodes.nodes)
    if items.run_ids:
        effects.merge(await settle_items(conn, q, items.run_ids, items.nodes))
    return await end_children(conn, q, effects, also=children)


async def end_children(
    conn: db.Conn, q: Queries, effects: Effects, also: Sequence[uuid.UUID] = ()
) -> Effects:
    """Settle the parent nodes of the child runs that ended (``effects.children``, and
    those in ``also`` that ended earlier; runs and parents locked by the caller), and so on
    up the parents that end in turn; returns ``effects`` with what that announces added."""
    seen: set[uuid.UUID] = set()
    todo = effects.children | set(also)
    while todo:
        seen |= todo
        more = await _settle_parents(conn, q, sorted(todo))
        effects.merge(more)
        todo = more.children - seen
    effects.children.clear()
    return effects


async def _settle_parents(conn: db.Conn, q: Queries, run_ids: Sequence[uuid.UUID]) -> Effects:
    effects = Effects()
    completed, items = _Done(), _Done()
    for row in await db.child_settle(conn, q, run_ids):
        what = row["what"]
        if what == "queue":  # a new attempt, which submits a new child
            effects.queues.add(row["value"])
        elif what == "completed" or row["settles"]:  # an item of a settling map settles
            done = completed if row["map_of"] is None else items
            done.add(row["run_id"], row["node"], skipped=False)
        else:  # out of attempts: the parent run fails with the child's end as its error
            await db.run_fail(conn, q, row["run_id"], row["value"], drop_running=False)
            effects.merge(Effects.ending(row["run_id"]))
    if items.run_ids:
        effects.merge(await settle_items(conn, q, items.run_ids, items.nodes))
    return effects.merged(await advance(conn, q, completed.run_ids, completed.nodes))


async def cancel_children(conn: db.Conn, q: Queries, run_ids: Sequence[uuid.UUID]) -> Effects:
    """Cancel the child runs of ``run_ids`` (locked by the caller) that have not ended, and
    theirs; their locks are taken after their parents', as run_lock_many orders them."""
    effects = Effects()
    children = await db.run_children(conn, q, run_ids)
    while children:
        await db.run_lock_many(conn, q, children)
        for child in children:
            if await db.run_cancel(conn, q, child):
                effects.ended.add(child)  # its parent node was cancelled: nothing to settle
        children = await db.run_children(conn, q, children)
    return effects


@dataclass(slots=True)
class _Done:
    """Nodes to advance past, as node_advance takes them (one list per column)."""

    run_ids: list[uuid.UUID] = field(default_factory=list)
    nodes: list[str] = field(default_factory=list)
    skipped: list[bool] = field(default_factory=list)

    def add(self, run_id: uuid.UUID, node: str, *, skipped: bool) -> None:
        self.run_ids.append(run_id)
        self.nodes.append(node)
        self.skipped.append(skipped)

    def add_all(
        self, run_ids: Sequence[uuid.UUID], nodes: Sequence[str], *, skipped: bool = False
    ) -> None:
        self.run_ids.extend(run_ids)
        self.nodes.extend(nodes)
        self.skipped.extend([skipped] * len(nodes))

    def extend(self, other: _Done) -> None:
        self.run_ids.extend(other.run_ids)
        self.nodes.extend(other.nodes)
        self.skipped.extend(other.skipped)


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


async def release(conn: db.Conn, q: Queries, run_id: uuid.UUID) -> Effects:
    """Release the ready nodes of a re-opened run (locked by the caller), and advance past
    those that settle at once (signalled waits, skipped nodes, empty maps)."""
    effects = Effects()
    done = await _released(conn, q, await db.run_release(conn, q, run_id), effects)
    return effects.merged(await advance(conn, q, done.run_ids, done.nodes, skipped=done.skipped))


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
    return await end_children(conn, q, await finish_waits(conn, q, [run_id], [node]))


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
    """Fail a wait node whose timeout passed, and its run."""
    await db.run_lock_many(conn, q, [run_id])
    if not await db.wait_expire(conn, q, run_id, node, error):
        return Effects()
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
