"""Workflow-node transitions: moving a run's graph forward inside one transaction.

A node that completes (or is skipped) releases the nodes after it (``advance``); releasing can
settle others at once, which are advanced past in turn: a wait node whose signal came early, a
map node that grows its item nodes (``expand_maps``) and counts them down as they settle
(``settle_items``), a child node whose child run ended (``end_children``), a node whose branch
was not taken. Every function here runs on a connection already in a transaction, on runs the
caller locked first (``run_lock_many``), so the statements see each run's current state and
transitions of one run never interleave. What they return is what to publish after commit.

The transitions callers start (cancel, retry, signal, a last attempt failing, timeouts) are in
``transitions``, which names the ones here that the insert path and the completer start too.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field

from cyclone._services.effects import SCHEDULES_WAKEUP, Effects
from cyclone._storage import queries as db
from cyclone._storage.loader import Queries


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


async def release(conn: db.Conn, q: Queries, run_id: uuid.UUID) -> Effects:
    """Release the ready nodes of a re-opened run (locked by the caller), and advance past
    those that settle at once (signalled waits, skipped nodes, empty maps)."""
    effects = Effects()
    done = await _released(conn, q, await db.run_release(conn, q, run_id), effects)
    return effects.merged(await advance(conn, q, done.run_ids, done.nodes, skipped=done.skipped))


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
    map_of, child, sleep): an item node settles on its map node, a child node waits for its
    child run (of ``children``, the runs the caller submitted for them: settled at once if
    one already ended), a sleep node sleeps (woken at once if its wake time has passed), any
    other node releases its children."""
    nodes, items, sleeping = _Done(), _Done(), _Done()
    for r in rows:
        if r["sleep"]:
            sleeping.add(r["run_id"], r["node"], skipped=False)
        elif not r["child"]:
            (nodes if r["map_of"] is None else items).add(r["run_id"], r["node"], skipped=False)
    effects = await advance(conn, q, nodes.run_ids, nodes.nodes)
    if items.run_ids:
        effects.merge(await settle_items(conn, q, items.run_ids, items.nodes))
    if sleeping.run_ids:
        # After commit, every worker's timer reads the new wake times, to fire them on time.
        effects.queues.add(SCHEDULES_WAKEUP)
        effects.merge(await wake_sleeps(conn, q, sleeping.run_ids, sleeping.nodes))
    return await end_children(conn, q, effects, also=children)


async def wake_sleeps(
    conn: db.Conn, q: Queries, run_ids: Sequence[uuid.UUID], nodes: Sequence[str]
) -> Effects:
    """Complete the sleep nodes among ``nodes`` whose wake time has come, and advance past
    them (runs locked by the caller)."""
    woken = await db.sleep_wake_many(conn, q, run_ids, nodes)
    return await advance(conn, q, [r["run_id"] for r in woken], [r["node"] for r in woken])


async def finish_waits(
    conn: db.Conn, q: Queries, run_ids: Sequence[uuid.UUID], nodes: Sequence[str]
) -> Effects:
    """Complete reachable wait nodes that have their signal, and advance past them (runs
    locked by the caller)."""
    finished = await db.wait_complete_many(conn, q, run_ids, nodes)
    return await advance(conn, q, [r["run_id"] for r in finished], [r["node"] for r in finished])


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
