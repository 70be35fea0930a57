"""The scheduler: each worker's timer that fires schedules, run deadlines and wait timeouts
on time, and the ``client.schedules`` facade that stores and changes schedules at run time.

No leader: every worker's timer sleeps until the first due slot (by the database's clock),
then runs a firing pass (:mod:`cyclone._worker.firing`): one transaction that locks the due rows it
can fire, writes each slot's run by its slot key and moves ``next_at`` past now. So each slot
makes exactly one run, whatever the number of workers or the skew of their clocks.

The timer re-reads when it is due at the latest every ``poll`` seconds (the floor) and when
``client.schedules`` changes a row (a NOTIFY on the client's channel). A worker fires the
schedules it declares and the dynamic ones whose target it serves; a schedule removed from
code is fired by nobody as soon as no running worker declares it.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import datetime as dt
import logging
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any

from cyclone._model.errors import InvalidScheduleError, InvalidStateError, ScheduleNotFoundError
from cyclone._model.schedules import Schedule, check_unique, slot_key, trigger_key, validate_name
from cyclone._model.steps import Kind
from cyclone._services.loops import jittered, wait_woken
from cyclone._services.notifier import queue_payload
from cyclone._storage import queries as db
from cyclone._worker import maintenance
from cyclone._worker.firing import Firing, stored_timing

if TYPE_CHECKING:
    from cyclone._client import Client
    from cyclone._model.workflows import Workflow

logger = logging.getLogger("cyclone")

# Not a valid queue name, so no worker's producer mistakes this wakeup for its queue's.
SCHEDULES_WAKEUP = "@schedules"
_BUSY_RETRY = 0.02  # a due row locked by another worker firing it: look again this soon


class Scheduler:
    """The timer service of one worker (see the module docstring).

    ``schedules`` are the worker's declared schedules; ``kinds`` and ``workflows`` what it
    serves (for dynamic schedules). ``poll`` is the floor of the timer; ``lease`` how long a
    declaration lasts without a refresh (refreshed every third of it).
    """

    def __init__(
        self,
        client: Client,
        schedules: Sequence[Schedule[Any]],
        *,
        kinds: Mapping[str, Kind[Any, Any]],
        workflows: Mapping[str, Workflow[Any]],
        worker_id: str,
        poll: float = 5.0,
        lease: float = 60.0,
    ) -> None:
        self.client = client
        self.declared = check_unique(list(schedules))
        self._firing = Firing(
            client, self.declared, kinds=kinds, workflows=workflows, worker_id=worker_id
        )
        self.worker_id = worker_id
        self.poll = poll
        self.lease = lease
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._unsubscribe: Any = None
        self._handled_overdue: dt.datetime | None = None

    async def start(self) -> None:
        """Upsert the declared schedules, then start the timer in the running loop."""
        await self.declare()
        notifier = self.client.services.notifier
        if notifier is not None:
            self._unsubscribe = notifier.subscribe_queues(self._on_wakeup)
            notifier.acquire()
        self._task = asyncio.get_running_loop().create_task(self._run(), name="cyclone-timer")

    async def stop(self) -> None:
        """Stop the timer; a firing pass in flight rolls back and another worker does it."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if self._unsubscribe is not None:
            self._unsubscribe()
            self._unsubscribe = None
            assert self.client.services.notifier is not None  # subscribed through it
            await self.client.services.notifier.release()

    def wake(self) -> None:
        """Re-read when the timer is due now (a schedule changed)."""
        self._wake.set()

    def _on_wakeup(self, queue: str) -> None:
        if queue in ("", SCHEDULES_WAKEUP):  # "": the listener reconnected
            self._wake.set()

    async def declare(self) -> None:
        """Upsert this worker's declared schedules and refresh their lease."""
        if not self.declared:
            return
        now = dt.datetime.now(dt.UTC)
        rows = [(s.name, _definition(s, now)) for s in self.declared.values()]
        async with self.client.services.database.acquire() as conn:
            await db.schedule_declare_many(conn, self.client.queries, self.lease, rows)

    async def _run(self) -> None:
        refreshed = time.monotonic()
        while True:
            self._wake.clear()
            delay = self.poll
            try:
                if self.declared and time.monotonic() - refreshed >= self.lease / 3:
                    async with self.client.services.database.acquire() as conn:
                        await db.schedule_refresh(
                            conn, self.client.queries, self.lease, sorted(self.declared)
                        )
                    refreshed = time.monotonic()
                delay = await self._step()
            except db.DATABASE_ERRORS as exc:
                logger.warning(
                    "schedule timer failed: %s; retrying in %.1f s",
                    exc,
                    self.poll,
                    extra={"worker": self.worker_id},
                )
            except Exception:  # a supervised background task: log and carry on
                logger.exception(
                    "schedule timer failed; retrying in %.1f s",
                    self.poll,
                    extra={"worker": self.worker_id},
                )
            if delay > 0:
                await wait_woken(self._wake, delay)

    async def _step(self) -> float:
        """Fire what is due now; return how long to sleep before looking again."""
        async with self.client.services.database.acquire() as conn:
            due = await db.schedule_next_due(
                conn, self.client.queries, sorted(self.declared), self._firing.targets, None
            )
        now: dt.datetime = due["now"]
        slot = due["schedule_due"]
        if slot is not None and slot <= now:
            claimed = await self.fire_due()
            return 0.0 if claimed else _BUSY_RETRY
        overdue = min((t for t in (due["deadline_due"], due["wait_due"]) if t), default=None)
        if overdue is not None and overdue <= now and overdue != self._handled_overdue:
            # Once per due time: one that stays due (its run is locked, say) waits for the
            # maintenance pass instead of spinning this loop.
            self._handled_overdue = overdue
            await maintenance.expire_overdue(self.client, worker_id=self.worker_id)
            return 0.0
        soonest: dt.datetime | None = min(
            (t for t in (slot, overdue) if t is not None and t > now), default=None
        )
        if soonest is None:
            return jittered(self.poll)
        return min(self.poll, (soonest - now).total_seconds() + 0.001)

    async def fire_due(self, now: dt.datetime | None = None) -> int:
        """One firing pass (``now``, for tests, stands for the database's clock); returns
        the schedules claimed."""
        return await self._firing.fire_due(now)


def _definition(s: Schedule[Any], now: dt.datetime) -> db.ScheduleDefinition:
    t = s.timing
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
        input=s.encoded_input,
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

    def __init__(self, client: Client) -> None:
        self._client = client

    async def list(self) -> builtins.list[ScheduleInfo]:
        """Every stored schedule, by name."""
        async with self._client.services.database.acquire() as conn:
            rows = await db.schedule_list(conn, self._client.queries, None)
        return [_info(r) for r in rows]

    async def get(self, name: str) -> ScheduleInfo:
        """The schedule ``name``; :class:`ScheduleNotFoundError` if there is none."""
        async with self._client.services.database.acquire() as conn:
            rows = await db.schedule_list(conn, self._client.queries, validate_name(name))
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
        async with self._client.services.database.acquire() as conn:
            at = await db.schedule_trigger(conn, self._client.queries, name)
        if at is None:
            raise ScheduleNotFoundError(name)
        self._client.services.publisher.publish([queue_payload(SCHEDULES_WAKEUP)])
        return trigger_key(name, at)

    async def create(self, schedule: Schedule[Any]) -> ScheduleInfo:
        """Store a dynamic schedule, kept until :meth:`delete`; workers that serve its target
        fire it. Its input must be a value (it is stored), not a function."""
        definition = _dynamic_definition(schedule)
        async with self._client.services.database.acquire() as conn:
            created = await db.schedule_create(
                conn, self._client.queries, schedule.name, definition
            )
        if not created:
            raise InvalidStateError(
                f"a schedule named {schedule.name!r} exists already: update() changes a "
                "dynamic one, delete() removes it"
            )
        self._client.services.publisher.publish([queue_payload(SCHEDULES_WAKEUP)])
        return await self.get(schedule.name)

    async def update(self, schedule: Schedule[Any]) -> ScheduleInfo:
        """Replace the dynamic schedule of the same name; its next slot is recomputed."""
        definition = _dynamic_definition(schedule)

        async def change(conn: db.Conn, stored: db.Record) -> None:
            if not stored["dynamic"]:
                raise InvalidStateError(
                    f"schedule {schedule.name!r} is declared in code: change its declaration "
                    "and deploy; update() changes dynamic schedules only"
                )
            await db.schedule_update(conn, self._client.queries, schedule.name, definition)

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
            await db.schedule_delete(conn, self._client.queries, name)

        await self._change(name, change)

    async def _set_paused(self, conn: db.Conn, row: db.Record, paused: bool) -> None:
        next_at = None if paused else stored_timing(row).next_after(row["now"])
        await db.schedule_set_paused(conn, self._client.queries, row["name"], paused, next_at)

    async def _change(self, name: str, change: Any) -> None:
        validate_name(name)
        async with self._client.services.database.transact() as conn:
            row = await db.schedule_lock(conn, self._client.queries, name)
            if row is None:
                raise ScheduleNotFoundError(name)
            await change(conn, row)
        self._client.services.publisher.publish([queue_payload(SCHEDULES_WAKEUP)])


def _dynamic_definition(schedule: Schedule[Any]) -> db.ScheduleDefinition:
    if not isinstance(schedule, Schedule):
        raise InvalidScheduleError(f"{schedule!r} is not a schedule from cyclone.schedule()")
    if schedule.input_fn is not None:
        raise InvalidScheduleError(
            f"schedule {schedule.name!r}: a dynamic schedule's input must be a value (it is "
            "stored in the database), not a function; declare it in code to use a function"
        )
    return _definition(schedule, dt.datetime.now(dt.UTC))
