"""The outcome writes: what completing, releasing or failing attempts does to the database,
and how to find in the record whether an earlier try of such a write committed.

Each write takes a connection and a group of outcomes of one kind, and says which attempts
the database accepted and what the write changed (:class:`Effects`, for the publisher to
announce once it commits). Every write is fenced by the attempt's (task, claims): an outcome
of an attempt whose task was reclaimed or cancelled matches no row and is not accepted.

    complete_jobs     job completions, in one statement (their runs end); those of kinds
                      that keep nothing in one statement of their own (their runs go)
    complete_nodes    workflow node completions with what they release: their runs advanced
                      (dependents queued, maps expanded), child runs of child nodes submitted;
                      in the caller's transaction
    release           retries, snoozes and hand-backs, in one statement
    fail              one attempt failed for good: its job or node fails, and its run with it

Each has a ``confirm_*`` twin, which asks the record (not the tasks, which a committed write
changed) which of the outcomes an earlier try wrote. When to write, on which connection, in
which transaction and how often to try is the completer's business (``completer.py``).
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Protocol

from cyclone._services import transitions
from cyclone._services.transitions import Effects
from cyclone._storage import queries as db
from cyclone._storage.loader import Queries
from cyclone._worker.outcomes import Completed, Failed, HandedBack, Released, Retry

Accepted = set[tuple[int, int]]
"""The attempts (task id, claims) whose outcome the database took."""


class Spawn(Protocol):
    """Submits the child runs of completed child nodes on the completion's connection."""

    def prepare(self, outcome: Completed) -> None:
        """Make ready, outside any transaction, what the outcome's child node submits."""

    def forget(self, outcomes: Sequence[Completed]) -> None:
        """Drop what was made ready for these outcomes, which submit nothing."""

    async def __call__(
        self, conn: db.Conn, outcomes: Sequence[Completed]
    ) -> tuple[Effects, list[uuid.UUID]]:
        """Submit the child runs of these child nodes: what that announces, and the runs."""


class OutcomeWrites:
    """The writes of one worker's outcomes, with ``queries``; ``spawn`` submits the child
    runs of its child nodes (None: it serves no workflow with child nodes); ``discard``
    names the kinds whose completed jobs keep nothing (their runs are deleted as they
    complete)."""

    def __init__(
        self, queries: Queries, spawn: Spawn | None = None, discard: frozenset[str] = frozenset()
    ) -> None:
        self._q = queries
        self._spawn = spawn
        self._discard = discard

    # Completions

    async def complete_jobs(
        self, conn: db.Conn, outcomes: Sequence[Completed]
    ) -> tuple[Accepted, Effects]:
        kept = [o for o in outcomes if o.claimed.kind not in self._discard]
        rows: list[db.Record] = []
        if kept:  # the default path: one statement, as without any retention
            rows = await db.job_complete_many(conn, self._q, _completions(kept))
        if len(kept) < len(outcomes):
            gone = [o for o in outcomes if o.claimed.kind in self._discard]
            rows += await db.job_discard_many(conn, self._q, db.Fence.of(o.claimed for o in gone))
        effects = Effects(ended={r["run_id"] for r in rows})
        return {(r["id"], r["claims"]) for r in rows}, effects

    async def complete_nodes(
        self, conn: db.Conn, outcomes: Sequence[Completed]
    ) -> tuple[Accepted, Effects]:
        """Complete workflow nodes and advance their runs (in the caller's transaction)."""
        await db.run_lock_many(conn, self._q, [o.claimed.run_id for o in outcomes])
        rows = await db.node_complete_many(conn, self._q, _completions(outcomes))
        accepted = {(r["id"], r["claims"]) for r in rows}
        spawned: Effects | None = None
        children: list[uuid.UUID] = []
        if waiting := {(r["id"], r["claims"]) for r in rows if r["child"]}:
            # Child nodes: their child runs, in this transaction.
            assert self._spawn is not None, "a child node completed by a worker without spawn"
            nodes = [o for o in outcomes if o.claimed.key in waiting]
            spawned, children = await self._spawn(conn, nodes)
        if self._spawn is not None:
            self._spawn.forget([o for o in outcomes if o.claimed.key not in waiting])
        effects = await transitions.advance_completed(conn, self._q, rows, children)
        if spawned is not None:
            effects.merge(spawned)
        return accepted, effects

    async def complete(
        self, conn: db.Conn, outcomes: Sequence[Completed]
    ) -> tuple[Accepted, Effects]:
        """Complete jobs, or (all of them) workflow nodes."""
        if outcomes[0].claimed.node is None:
            return await self.complete_jobs(conn, outcomes)
        return await self.complete_nodes(conn, outcomes)

    async def confirm_completed(
        self, conn: db.Conn, unsure: Sequence[Completed], effects: Effects
    ) -> Accepted:
        """The attempts an earlier try completed; their jobs' runs ended.

        (What a node's completion released was announced by nobody; polling finds it.)
        """
        claimed = [o.claimed for o in unsure if o.claimed.kind not in self._discard]
        done = await db.attempts_completed(
            conn, self._q, db.Fence.of(claimed), [c.node for c in claimed]
        )
        found = [c for c in claimed if (c.run_id, c.node) in done]
        if discarded := [o.claimed for o in unsure if o.claimed.kind in self._discard]:
            gone = await db.jobs_discarded(conn, self._q, [c.run_id for c in discarded])
            found += [c for c in discarded if c.run_id in gone]
        effects.ended.update(c.run_id for c in found if c.node is None)
        return {c.key for c in found}

    # Tasks back to their queue

    async def release(
        self, conn: db.Conn, outcomes: Sequence[Released]
    ) -> tuple[Accepted, Effects]:
        """Retries, snoozes and hand-backs, in one statement."""
        delays = [0.0 if isinstance(o, HandedBack) else o.delay for o in outcomes]
        rows = await db.task_retry_many(
            conn,
            self._q,
            db.Fence.of(o.claimed for o in outcomes),
            delays,
            [o.error if isinstance(o, Retry) else None for o in outcomes],
            [not isinstance(o, Retry) for o in outcomes],  # snooze, hand-back: refunded
        )
        # A stale attempt and its task's next one may share a batch: the fence matched the
        # newer claim, the task's current one.
        claims: dict[int, int] = {}
        for o in outcomes:
            claims[o.claimed.id] = max(o.claimed.claims, claims.get(o.claimed.id, 0))
        accepted = {(r["id"], claims[r["id"]]) for r in rows}
        now = {o.claimed.id for o, d in zip(outcomes, delays, strict=True) if d <= 0}
        effects = Effects(queues={r["queue"] for r in rows if r["queue"] and r["id"] in now})
        return accepted, effects

    async def confirm_released(
        self, conn: db.Conn, unsure: Sequence[Released], effects: Effects
    ) -> Accepted:
        claimed = [o.claimed for o in unsure]
        return await db.attempts_released(
            conn, self._q, db.Fence.of(claimed), [c.attempt for c in claimed]
        )

    # Failures

    async def fail(self, conn: db.Conn, outcomes: Sequence[Failed]) -> tuple[Accepted, Effects]:
        """Fail one attempt for good: the job or node fails, and the run with it."""
        [o] = outcomes
        c = o.claimed
        owned, effects = await transitions.fail_node_or_job(
            conn, self._q, c, o.error, expired_only=False
        )
        return ({c.key} if owned else set()), effects

    async def confirm_failed(
        self, conn: db.Conn, unsure: Sequence[Failed], effects: Effects
    ) -> Accepted:
        done = await db.attempts_failed(
            conn,
            self._q,
            [o.claimed.run_id for o in unsure],
            [o.claimed.node for o in unsure],
            [o.error for o in unsure],
        )
        found = [o.claimed for o in unsure if (o.claimed.run_id, o.claimed.node) in done]
        effects.ended.update(c.run_id for c in found)
        return {c.key for c in found}


def _completions(outcomes: Sequence[Completed]) -> db.Completions:
    """The attempts of ``outcomes`` as the completion statements take them."""
    return db.Completions(db.Fence.of(o.claimed for o in outcomes), [o.output for o in outcomes])
