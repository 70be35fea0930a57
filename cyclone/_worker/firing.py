"""The firing pass of the schedule timer (:mod:`cyclone._worker.scheduler`): one transaction that
locks the due schedule rows this worker can fire (``FOR UPDATE SKIP LOCKED``), writes each
due slot's run with its slot key through a keyed insert (``idx_runs_submit_key``, as
``submit_once``), and moves each row's ``next_at`` past now.

A worker that dies mid-way rolls back and the next one fires the slot; one that fires a slot
another already did inserts nothing, so each slot makes exactly one run.
"""

from __future__ import annotations

import datetime as dt
import logging
import uuid
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any
from zoneinfo import ZoneInfo

from cyclone._enqueue.insert import Inserter, Parts, plan_jobs
from cyclone._enqueue.wakeups import track_wakeups
from cyclone._model import codec
from cyclone._model.errors import SubmitConflictError
from cyclone._model.keyring import reveal
from cyclone._model.schedules import Schedule, slot_key, trigger_key
from cyclone._model.steps import Kind
from cyclone._model.timing import plan
from cyclone._services.schedules import stored_timing
from cyclone._storage import queries as db

if TYPE_CHECKING:
    from cyclone._enqueue.wakeups import TrackedConnection
    from cyclone._model.workflows import Workflow

logger = logging.getLogger("cyclone")

_CLAIM_LIMIT = 100  # due schedules locked by one pass


class Firing:
    """The firing passes of one worker: its ``declared`` schedules, and the dynamic ones
    whose target is among the ``kinds`` and ``workflows`` it serves; runs are written
    through the client's insert ``parts``."""

    def __init__(
        self,
        parts: Parts,
        declared: Mapping[str, Schedule[Any]],
        *,
        kinds: Mapping[str, Kind[Any, Any]],
        workflows: Mapping[str, Workflow[Any]],
        worker_id: str,
    ) -> None:
        self._database = parts.database
        self._publisher = parts.publisher
        self._settings = parts.settings
        self._inserter = Inserter(parts)
        self.declared = declared
        self._kinds = dict(kinds)
        self._workflows = dict(workflows)
        self.targets = sorted({*self._kinds, *self._workflows})
        self.worker_id = worker_id

    async def fire_due(self, now: dt.datetime | None = None) -> int:
        """One firing pass: make the runs of every due slot and trigger this worker fires.

        ``now`` (tests) stands for the database's clock. Returns the schedules claimed.
        """
        q = self._database.queries
        async with self._database.acquire() as conn:
            ttx, wakeups = track_wakeups(conn)
            async with self._database.transaction(ttx):
                rows = await db.schedule_claim_due(
                    ttx.connection, q, sorted(self.declared), self.targets, now, _CLAIM_LIMIT
                )
                fired: list[tuple[str, float]] = []
                for row in rows:
                    fired.extend(await self._fire(ttx, row))
            # Reported as committed, before the wakeups go out: a worker in this process may
            # run (and its owner stop on) a slot's job as soon as its wakeup is handed over.
            for name, lag in fired:
                self._settings.observers.schedule_fired(name, lag)
            await self._publisher.committed(wakeups, conn)
        return len(rows)

    async def _fire(self, ttx: TrackedConnection, row: db.Record) -> list[tuple[str, float]]:
        """Fire one locked schedule row; (name, lag in seconds) of each slot that made a run."""
        name: str = row["name"]
        now: dt.datetime = row["now"]
        blocked = row["overlap"] == "skip" and row["last_state"] == "pending"
        due = plan(
            stored_timing(row),
            catch_up=row["catch_up"],
            window=row["catch_up_window"],
            overlap_blocked=blocked,
            next_at=row["next_at"],
            now=now,
        )
        log = {"schedule": name, "worker": self.worker_id}
        if row["paused"]:
            due = type(due)([], due.next_at)  # only a trigger fires a paused schedule
        elif due.missed_from is not None:
            why = "its previous run is still active (overlap='skip')"
            if not blocked:
                why = f"they were missed and catch_up={row['catch_up']!r} drops them"
            logger.warning(
                "schedule %s did not run slots from %s: %s",
                name,
                due.missed_from.isoformat(),
                why,
                extra=log,
            )
        keyed = [(slot_key(name, s), s) for s in due.fire]
        if row["triggered_at"] is not None:
            keyed.append((trigger_key(name, row["triggered_at"]), row["triggered_at"]))
        runs = await self._insert(ttx, row, keyed)
        last = next((runs[k] for k, _ in reversed(keyed) if k in runs), None)
        await db.schedule_advance(
            ttx.connection,
            self._database.queries,
            name,
            next_at=due.next_at,
            last_slot=due.fire[-1] if due.fire else None,
            last_run_id=last,
            triggered_at=row["triggered_at"],
        )
        for key, run_id in runs.items():
            logger.info("schedule %s made run %s (%s)", name, run_id, key, extra=log)
        return [(name, (now - s).total_seconds()) for k, s in keyed[: len(due.fire)] if k in runs]

    async def _insert(
        self, ttx: TrackedConnection, row: db.Record, keyed: list[tuple[str, dt.datetime]]
    ) -> dict[str, uuid.UUID]:
        """Write the run of each (key, slot); the keys that got a new run, with its id."""
        name: str = row["name"]
        declared = None if row["dynamic"] else self.declared.get(name)
        target: Kind[Any, Any] | Workflow[Any] | None
        if declared is not None:
            target = declared.target
        else:
            target = (self._kinds if row["job"] else self._workflows).get(row["target"])
        if target is None or not keyed:
            return {}
        values = []
        for key, slot in keyed:
            try:
                values.append((key, self._input(declared, target, row["input"], slot)))
            except Exception:  # the user's input function: skip its slot, keep the others
                logger.exception(
                    "schedule %s: building the input of %s failed; the slot is skipped",
                    name,
                    key,
                    extra={"schedule": name, "worker": self.worker_id},
                )
        if isinstance(target, Kind):
            return await self._insert_jobs(ttx, target, values)
        made: dict[str, uuid.UUID] = {}
        for key, value in values:
            try:
                run, created = await self._inserter.submit(ttx, target, key, value, {})
            except SubmitConflictError:
                continue  # the slot's run exists, made from another input: it stays
            if created:
                made[key] = run.id
        return made

    async def _insert_jobs(
        self, ttx: TrackedConnection, kind: Kind[Any, Any], values: list[tuple[str, Any]]
    ) -> dict[str, uuid.UUID]:
        plan = plan_jobs(self._settings, kind, [v for _, v in values], {})
        inserted = await db.schedule_job_insert_many(
            ttx.connection,
            self._database.queries,
            kind=kind.name,
            queue=kind.queue,
            priority=kind.priority,
            max_attempts=kind.max_attempts,
            ids=plan.ids,
            inputs=plan.encoded,
            keys=[k for k, _ in values],
        )
        if inserted:
            ttx.record(kind.queue)
            self._settings.observers.enqueued(kind.name, kind.queue, len(inserted))
        return {r["key"]: r["id"] for r in inserted}

    def _input(
        self, declared: Schedule[Any] | None, target: Any, stored: str | None, slot: dt.datetime
    ) -> Any:
        """A slot's input: the declaration's value or function of the slot, else the stored
        one (opened, if sealed)."""
        if declared is not None:
            if declared.input_fn is not None:
                return declared.input_fn(slot.astimezone(ZoneInfo(declared.timing.tz)))
            return declared.input
        return codec.decode(reveal(self._settings.cipher, stored or "null"), target.input_type)
