"""The scheduler: each worker's timer that fires schedules, run deadlines, wait timeouts and
sleep nodes' wake times on time (``client.schedules``, which stores and changes schedules at
run time, is :mod:`cyclone._services.schedules`).

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
import contextlib
import datetime as dt
import logging
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from cyclone._model.schedules import Schedule, check_unique
from cyclone._model.steps import Kind
from cyclone._services.effects import SCHEDULES_WAKEUP
from cyclone._services.loops import jittered, wait_woken
from cyclone._services.schedules import definition
from cyclone._storage import queries as db
from cyclone._worker import maintenance
from cyclone._worker.firing import Firing

if TYPE_CHECKING:
    from cyclone._enqueue.insert import Parts
    from cyclone._model.workflows import Workflow
    from cyclone._services.bundle import Services

logger = logging.getLogger("cyclone")

_BUSY_RETRY = 0.02  # a due row locked by another worker firing it: look again this soon


class Scheduler:
    """The timer service of one worker (see the module docstring).

    ``services`` are the client's parts (its database, its listener, what maintenance
    needs), ``parts`` its insert path's; ``schedules`` are the worker's declared schedules;
    ``kinds`` and ``workflows`` what it serves (for dynamic schedules). ``poll`` is the floor
    of the timer; ``lease`` how long a declaration lasts without a refresh (refreshed every
    third of it).
    """

    def __init__(
        self,
        services: Services,
        parts: Parts,
        schedules: Sequence[Schedule[Any]],
        *,
        kinds: Mapping[str, Kind[Any, Any]],
        workflows: Mapping[str, Workflow[Any]],
        worker_id: str,
        poll: float = 5.0,
        lease: float = 60.0,
    ) -> None:
        self._services = services
        self._database = services.database
        self._cipher = parts.settings.cipher  # seals the declared schedules' inputs
        self.declared = check_unique(list(schedules))
        self._firing = Firing(
            parts, self.declared, kinds=kinds, workflows=workflows, worker_id=worker_id
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
        notifier = self._services.notifier
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
            assert self._services.notifier is not None  # subscribed through it
            await self._services.notifier.release()

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
        cipher = self._cipher
        rows = [(s.name, definition(s, now, cipher)) for s in self.declared.values()]
        async with self._database.acquire() as conn:
            await db.schedule_declare_many(conn, self._database.queries, self.lease, rows)

    async def _run(self) -> None:
        refreshed = time.monotonic()
        while True:
            self._wake.clear()
            delay = self.poll
            try:
                if self.declared and time.monotonic() - refreshed >= self.lease / 3:
                    async with self._database.acquire() as conn:
                        await db.schedule_refresh(
                            conn, self._database.queries, self.lease, sorted(self.declared)
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
        async with self._database.acquire() as conn:
            due = await db.schedule_next_due(
                conn, self._database.queries, sorted(self.declared), self._firing.targets, None
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
            await maintenance.expire_overdue(self._services, worker_id=self.worker_id)
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
