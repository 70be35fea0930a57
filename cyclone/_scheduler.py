"""The scheduler: each worker's timer that fires schedules, run deadlines and wait timeouts
on time, and the ``client.schedules`` facade that stores and changes schedules at run time.

No leader: every worker's timer sleeps until the first due slot (by the database's clock),
then locks the due schedule rows it can fire (``FOR UPDATE SKIP LOCKED``), writes each slot's
run with its slot key through a keyed insert (``idx_runs_submit_key``, as ``submit_once``),
moves ``next_at`` past now and commits. A worker that dies mid-way rolls back and the next
one fires the slot; one that fires a slot another already did inserts nothing. So each slot
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
import random
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from cyclone import _codec
from cyclone import _maintenance as maintenance
from cyclone import _queries as db
from cyclone._errors import (
    InvalidScheduleError,
    InvalidStateError,
    ScheduleNotFoundError,
    SubmitConflictError,
)
from cyclone._insert import uuid7_many
from cyclone._kinds import Kind
from cyclone._notifier import queue_payload
from cyclone._schedules import (
    Schedule,
    Timing,
    check_unique,
    plan,
    slot_key,
    trigger_key,
    validate_name,
)

if TYPE_CHECKING:
    from cyclone._client import Client
    from cyclone._wakeups import TrackedConnection
    from cyclone._workflow import Workflow

logger = logging.getLogger("cyclone")

# Not a valid queue name, so no worker's producer mistakes this wakeup for its queue's.
SCHEDULES_WAKEUP = "@schedules"
_CLAIM_LIMIT = 100
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
        self._kinds = dict(kinds)
        self._workflows = dict(workflows)
        self._targets = sorted({*self._kinds, *self._workflows})
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
        if self.client.notify:
            self._unsubscribe = self.client._notifier.subscribe_queues(self._on_wakeup)
            self.client._notifier.acquire()
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
            await self.client._notifier.release()

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
        rows = [_declared_row(s, now) for s in self.declared.values()]
        async with self.client._acquire() as conn:
            await db.schedule_declare_many(conn, self.client.queries, self.lease, rows)

    async def _run(self) -> None:
        refreshed = time.monotonic()
        while True:
            self._wake.clear()
            delay = self.poll
            try:
                if self.declared and time.monotonic() - refreshed >= self.lease / 3:
                    async with self.client._acquire() as conn:
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
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(delay):
                        await self._wake.wait()

    async def _step(self) -> float:
        """Fire what is due now; return how long to sleep before looking again."""
        async with self.client._acquire() as conn:
            due = await db.schedule_next_due(
                conn, self.client.queries, sorted(self.declared), self._targets, None
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
            return self.poll * random.uniform(0.8, 1.0)
        return min(self.poll, (soonest - now).total_seconds() + 0.001)

    async def fire_due(self, now: dt.datetime | None = None) -> int:
        """One firing pass: make the runs of every due slot and trigger this worker fires.

        ``now`` (tests) stands for the database's clock. Returns the schedules claimed.
        """
        q = self.client.queries
        async with self.client._acquire() as conn, self.client.transaction(conn) as ttx:
            rows = await db.schedule_claim_due(
                ttx.connection, q, sorted(self.declared), self._targets, now, _CLAIM_LIMIT
            )
            fired: list[tuple[str, float]] = []
            for row in rows:
                fired.extend(await self._fire(ttx, row))
        for name, lag in fired:
            self.client.observers.schedule_fired(name, lag)
        return len(rows)

    async def _fire(self, ttx: TrackedConnection, row: db.Record) -> list[tuple[str, float]]:
        name: str = row["name"]
        now: dt.datetime = row["now"]
        timing = _timing(row)
        blocked = row["overlap"] == "skip" and row["last_state"] == "pending"
        due = plan(
            timing,
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
            self.client.queries,
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
                values.append((key, _input(declared, target, row["input"], slot)))
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
                run, created = await target.submit_once_tx(self.client, ttx, key, value)
            except SubmitConflictError:
                continue  # the slot's run exists, made from another input: it stays
            if created:
                made[key] = run.id
        return made

    async def _insert_jobs(
        self, ttx: TrackedConnection, kind: Kind[Any, Any], values: list[tuple[str, Any]]
    ) -> dict[str, uuid.UUID]:
        what = f"input of {kind.name!r}"
        limit = self.client.payload_limit
        encoded = _codec.encode_many(
            [v for _, v in values], kind.input_type, what=what, limit=limit
        )
        inserted = await db.schedule_job_insert_many(
            ttx.connection,
            self.client.queries,
            kind=kind.name,
            queue=kind.queue,
            priority=kind.priority,
            max_attempts=kind.max_attempts,
            ids=uuid7_many(len(values)),
            inputs=encoded,
            keys=[k for k, _ in values],
        )
        if inserted:
            ttx.record(kind.queue)
            self.client.observers.enqueued(kind.name, kind.queue, len(inserted))
        return {r["key"]: r["id"] for r in inserted}


def _input(
    declared: Schedule[Any] | None, target: Any, stored: str | None, slot: dt.datetime
) -> Any:
    if declared is not None:
        if declared.input_fn is not None:
            return declared.input_fn(slot.astimezone(_zone(declared.timing.tz)))
        return declared.input
    return _codec.decode(stored or "null", target.input_type)


def _zone(tz: str) -> dt.tzinfo:
    from zoneinfo import ZoneInfo

    return ZoneInfo(tz)


def _timing(row: db.Record) -> Timing:
    return Timing(row["cron"], row["every"], row["tz"], row["start_at"])


def _definition(s: Schedule[Any], now: dt.datetime) -> tuple[Any, ...]:
    """(target, job, cron, every, start, tz, catch_up, window, overlap, input, next_at)."""
    t = s.timing
    return (
        s.target.name,
        s.job,
        t.cron,
        t.every,
        t.start,
        t.tz,
        s.catch_up,
        s.catch_up_window,
        s.overlap,
        s.encoded_input,
        t.next_after(now),
    )


def _declared_row(s: Schedule[Any], now: dt.datetime) -> tuple[Any, ...]:
    return (s.name, *_definition(s, now))


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


def _info(row: db.Record) -> ScheduleInfo:
    until = row["declared_until"]
    return ScheduleInfo(
        name=row["name"],
        target=row["target"],
        job=row["job"],
        cron=row["cron"],
        every=row["every"],
        tz=row["tz"],
        start=row["start_at"],
        catch_up=row["catch_up"],
        catch_up_window=row["catch_up_window"],
        overlap=row["overlap"],
        dynamic=row["dynamic"],
        declared=row["dynamic"] or (until is not None and until > row["now"]),
        declared_until=until,
        paused=row["paused"],
        next_at=row["next_at"],
        last_slot=row["last_slot"],
        last_run_id=row["last_run_id"],
        triggered_at=row["triggered_at"],
    )


class Schedules:
    """``client.schedules``: the schedules stored in the client's schema, changed at run
    time without a deploy. Every change wakes the workers' timers."""

    def __init__(self, client: Client) -> None:
        self._client = client

    async def list(self) -> builtins.list[ScheduleInfo]:
        """Every stored schedule, by name."""
        async with self._client._acquire() as conn:
            rows = await db.schedule_list(conn, self._client.queries, None)
        return [_info(r) for r in rows]

    async def get(self, name: str) -> ScheduleInfo:
        """The schedule ``name``; :class:`ScheduleNotFoundError` if there is none."""
        async with self._client._acquire() as conn:
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
        async with self._client._acquire() as conn:
            at = await db.schedule_trigger(conn, self._client.queries, name)
        if at is None:
            raise ScheduleNotFoundError(name)
        self._client._publish([queue_payload(SCHEDULES_WAKEUP)])
        return trigger_key(name, at)

    async def create(self, schedule: Schedule[Any]) -> ScheduleInfo:
        """Store a dynamic schedule, kept until :meth:`delete`; workers that serve its target
        fire it. Its input must be a value (it is stored), not a function."""
        row = _dynamic_row(schedule)
        async with self._client._acquire() as conn:
            created = await db.schedule_create(conn, self._client.queries, schedule.name, *row)
        if not created:
            raise InvalidStateError(
                f"a schedule named {schedule.name!r} exists already: update() changes a "
                "dynamic one, delete() removes it"
            )
        self._client._publish([queue_payload(SCHEDULES_WAKEUP)])
        return await self.get(schedule.name)

    async def update(self, schedule: Schedule[Any]) -> ScheduleInfo:
        """Replace the dynamic schedule of the same name; its next slot is recomputed."""
        row = _dynamic_row(schedule)

        async def change(conn: db.Conn, stored: db.Record) -> None:
            if not stored["dynamic"]:
                raise InvalidStateError(
                    f"schedule {schedule.name!r} is declared in code: change its declaration "
                    "and deploy; update() changes dynamic schedules only"
                )
            await db.schedule_update(conn, self._client.queries, *row, name=schedule.name)

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
        next_at = None if paused else _timing(row).next_after(row["now"])
        await db.schedule_set_paused(conn, self._client.queries, row["name"], paused, next_at)

    async def _change(self, name: str, change: Any) -> None:
        validate_name(name)
        async with self._client._acquire() as conn, conn.transaction():
            row = await db.schedule_lock(conn, self._client.queries, name)
            if row is None:
                raise ScheduleNotFoundError(name)
            await change(conn, row)
        self._client._publish([queue_payload(SCHEDULES_WAKEUP)])


def _dynamic_row(schedule: Schedule[Any]) -> tuple[Any, ...]:
    if not isinstance(schedule, Schedule):
        raise InvalidScheduleError(f"{schedule!r} is not a schedule from cyclone.schedule()")
    if schedule.input_fn is not None:
        raise InvalidScheduleError(
            f"schedule {schedule.name!r}: a dynamic schedule's input must be a value (it is "
            "stored in the database), not a function; declare it in code to use a function"
        )
    return _definition(schedule, dt.datetime.now(dt.UTC))
