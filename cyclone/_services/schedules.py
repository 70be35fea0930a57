"""``client.schedules``: the schedules stored in the client's schema, read and changed at run
time without a deploy, and how a declaration becomes a stored row. Every change wakes the
workers' timers (:mod:`cyclone._worker.scheduler`) with a NOTIFY on the client's channel.
"""

from __future__ import annotations

import builtins
import datetime as dt
import uuid
from dataclasses import dataclass, fields
from typing import Any

from cyclone._model.errors import InvalidScheduleError, InvalidStateError, ScheduleNotFoundError
from cyclone._model.keyring import Keyring
from cyclone._model.schedules import Schedule, slot_key, trigger_key, validate_name
from cyclone._model.timing import Timing
from cyclone._services.database import Database
from cyclone._services.effects import SCHEDULES_WAKEUP
from cyclone._services.notifier import queue_payload
from cyclone._services.publisher import Publisher
from cyclone._storage import queries as db


def stored_timing(row: db.Record) -> Timing:
    """The timing of a stored schedule row."""
    return Timing(row["cron"], row["every"], row["tz"], row["start_at"])


def definition(
    s: Schedule[Any], now: dt.datetime, cipher: Keyring | None = None
) -> db.ScheduleDefinition:
    """The row of ``s`` as stored, its input sealed with ``cipher`` when there is one."""
    t = s.timing
    stored = s.encoded_input
    if stored is not None and cipher is not None:
        stored = cipher.seal(stored)
    return db.ScheduleDefinition(
        target=s.target.name,
        job=s.job,
        cron=t.cron,
        every=t.every,
        start_at=t.start,
        tz=t.tz,
        catch_up=s.catch_up,
        catch_up_window=s.catch_up_window,
        overlap=s.overlap,
        input=stored,
        next_at=t.next_after(now),
    )


@dataclass(frozen=True, slots=True)
class ScheduleInfo:
    """A stored schedule as ``client.schedules`` lists it.

    ``dynamic``: created through the API (kept until deleted), else declared in code;
    ``declared``: a running worker declared it within its lease (always True when dynamic).
    ``next_at`` is the next slot to fire; ``last_slot`` and ``last_run_id`` the newest run
    made. ``key(slot)`` is the run key of a slot, for ``RunQuery(key=...)``.
    """

    name: str
    target: str
    job: bool
    cron: str | None
    every: dt.timedelta | None
    tz: str
    start: dt.datetime | None
    catch_up: str
    catch_up_window: dt.timedelta | None
    overlap: str
    dynamic: bool
    declared: bool
    declared_until: dt.datetime | None
    paused: bool
    next_at: dt.datetime
    last_slot: dt.datetime | None
    last_run_id: uuid.UUID | None
    triggered_at: dt.datetime | None

    def key(self, slot: dt.datetime) -> str:
        """The run key of this schedule's slot at ``slot``."""
        return slot_key(self.name, slot)


# ScheduleInfo's fields read from the row's column of the same name (or the one named here).
_STORED = [f.name for f in fields(ScheduleInfo) if f.name != "declared"]
_COLUMNS = {"start": "start_at"}


def _info(row: db.Record) -> ScheduleInfo:
    until = row["declared_until"]
    declared = row["dynamic"] or (until is not None and until > row["now"])
    stored = {name: row[_COLUMNS.get(name, name)] for name in _STORED}
    return ScheduleInfo(declared=declared, **stored)


class Schedules:
    """``client.schedules``: the schedules stored in the client's schema, changed at run
    time without a deploy. Every change wakes the workers' timers."""

    def __init__(
        self, database: Database, publisher: Publisher, cipher: Keyring | None = None
    ) -> None:
        self._database = database
        self._publisher = publisher
        self._cipher = cipher

    async def list(self) -> builtins.list[ScheduleInfo]:
        """Every stored schedule, by name."""
        async with self._database.acquire() as conn:
            rows = await db.schedule_list(conn, self._database.queries, None)
        return [_info(r) for r in rows]

    async def get(self, name: str) -> ScheduleInfo:
        """The schedule ``name``; :class:`ScheduleNotFoundError` if there is none."""
        async with self._database.acquire() as conn:
            rows = await db.schedule_list(conn, self._database.queries, validate_name(name))
        if not rows:
            raise ScheduleNotFoundError(name)
        return _info(rows[0])

    async def pause(self, name: str) -> None:
        """Stop making runs for ``name``'s slots until :meth:`resume` (also across deploys)."""
        await self._change(name, lambda conn, row: self._set_paused(conn, row, True))

    async def resume(self, name: str) -> None:
        """Make runs again from the next slot after now; slots passed while paused stay
        unrun, whatever the catch-up policy."""
        await self._change(name, lambda conn, row: self._set_paused(conn, row, False))

    async def trigger(self, name: str) -> str:
        """Ask for one run of ``name`` now, paused or not, outside its slots; returns the run's
        key (``schedule:<name>:trigger:<time>``). A worker that fires the schedule makes the
        run within moments; a second trigger before that makes no second run."""
        validate_name(name)
        async with self._database.acquire() as conn:
            at = await db.schedule_trigger(conn, self._database.queries, name)
        if at is None:
            raise ScheduleNotFoundError(name)
        self._publisher.publish([queue_payload(SCHEDULES_WAKEUP)])
        return trigger_key(name, at)

    async def create(self, schedule: Schedule[Any]) -> ScheduleInfo:
        """Store a dynamic schedule, kept until :meth:`delete`; workers that serve its target
        fire it. Its input must be a value (it is stored), not a function."""
        definition = _dynamic_definition(schedule, self._cipher)
        async with self._database.acquire() as conn:
            created = await db.schedule_create(
                conn, self._database.queries, schedule.name, definition
            )
        if not created:
            raise InvalidStateError(
                f"a schedule named {schedule.name!r} exists already: update() changes a "
                "dynamic one, delete() removes it"
            )
        self._publisher.publish([queue_payload(SCHEDULES_WAKEUP)])
        return await self.get(schedule.name)

    async def update(self, schedule: Schedule[Any]) -> ScheduleInfo:
        """Replace the dynamic schedule of the same name; its next slot is recomputed."""
        definition = _dynamic_definition(schedule, self._cipher)

        async def change(conn: db.Conn, stored: db.Record) -> None:
            if not stored["dynamic"]:
                raise InvalidStateError(
                    f"schedule {schedule.name!r} is declared in code: change its declaration "
                    "and deploy; update() changes dynamic schedules only"
                )
            await db.schedule_update(conn, self._database.queries, schedule.name, definition)

        await self._change(schedule.name, change)
        return await self.get(schedule.name)

    async def delete(self, name: str) -> None:
        """Delete ``name``; a declared one only once no running worker declares it."""

        async def change(conn: db.Conn, stored: db.Record) -> None:
            if not stored["dynamic"] and stored["declared"]:
                raise InvalidStateError(
                    f"schedule {name!r} is still declared by a running worker: remove it "
                    "from the workers' schedules= and deploy (or pause it)"
                )
            await db.schedule_delete(conn, self._database.queries, name)

        await self._change(name, change)

    async def _set_paused(self, conn: db.Conn, row: db.Record, paused: bool) -> None:
        next_at = None if paused else stored_timing(row).next_after(row["now"])
        await db.schedule_set_paused(conn, self._database.queries, row["name"], paused, next_at)

    async def _change(self, name: str, change: Any) -> None:
        validate_name(name)
        async with self._database.transact() as conn:
            row = await db.schedule_lock(conn, self._database.queries, name)
            if row is None:
                raise ScheduleNotFoundError(name)
            await change(conn, row)
        self._publisher.publish([queue_payload(SCHEDULES_WAKEUP)])


def _dynamic_definition(schedule: Schedule[Any], cipher: Keyring | None) -> db.ScheduleDefinition:
    if not isinstance(schedule, Schedule):
        raise InvalidScheduleError(f"{schedule!r} is not a schedule from cyclone.schedule()")
    if schedule.input_fn is not None:
        raise InvalidScheduleError(
            f"schedule {schedule.name!r}: a dynamic schedule's input must be a value (it is "
            "stored in the database), not a function; declare it in code to use a function"
        )
    return definition(schedule, dt.datetime.now(dt.UTC), cipher)
