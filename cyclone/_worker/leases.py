"""The lease keeper: holds this worker's attempts from claim until their outcome is written.

Every heartbeat it records the worker as live and extends the leases of all the attempts it
holds in one statement, whether their handler still runs or their outcome waits in the
completer's buffer. An attempt missing from the answer lost its task (its run was cancelled
or failed, or its lease ran out and the task was taken over): its handler is cancelled, and
its writes roll back. A handler whose lease could not be renewed (the database out of reach)
is stopped before the lease runs out: past it another worker may run the task. ``hurry()``
cancels the handlers still running, for shutdown.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from cyclone._services.database import Database
from cyclone._services.loops import every
from cyclone._storage import queries as db
from cyclone._worker.outcomes import Claimed

logger = logging.getLogger("cyclone")


@dataclass(slots=True)
class _Held:
    claimed: Claimed
    task: asyncio.Task[None]
    renewed: float  # the event loop's time of its claim, or its last renewal's send
    reason: str | None = None  # why we stopped it: "lost", "shutdown", "overdue", "limited"
    finishing: bool = False  # its handler is over: its task must not be cancelled


class LeaseKeeper:
    """Holds the attempts of one worker and keeps their leases."""

    def __init__(
        self,
        database: Database,
        *,
        worker_id: str,
        lease: float,
        interval: float,
        present: Callable[[db.Conn], Awaitable[None]],
    ) -> None:
        self._database = database
        self._worker_id = worker_id
        self._lease = lease
        self._interval = interval
        self._present = present
        # Keyed by (task id, claims): a stale attempt and its task's next attempt can overlap.
        self._held: dict[tuple[int, int], _Held] = {}
        self.idle = asyncio.Event()
        """Set while no attempt is held (none running, no outcome unwritten)."""
        self.idle.set()

    def hold(self, claimed: Claimed, task: asyncio.Task[None]) -> None:
        """Keep the lease of an attempt whose ``task`` has just started."""
        self._held[claimed.key] = _Held(claimed, task, asyncio.get_running_loop().time())
        self.idle.clear()

    def drop(self, claimed: Claimed) -> None:
        """Stop keeping the attempt's lease: its outcome is written (or given up on)."""
        self._held.pop(claimed.key, None)
        if not self._held:
            self.idle.set()

    def finishing(self, claimed: Claimed) -> None:
        """The attempt's handler is over; what is left (its outcome) must not be cancelled."""
        held = self._held.get(claimed.key)
        if held is not None:
            held.finishing = True

    def reason(self, claimed: Claimed) -> str | None:
        """Why the attempt was stopped, if by us: "lost", "shutdown", or (see :meth:`mark`)
        "overdue" or "limited"."""
        held = self._held.get(claimed.key)
        return None if held is None else held.reason

    def tasks(self) -> list[asyncio.Task[None]]:
        """The tasks of every attempt held."""
        return [h.task for h in self._held.values()]

    def hurry(self) -> None:
        """Cancel the handlers still running; their attempts are handed back."""
        self._stop_all("shutdown")

    def _stop_all(self, reason: str) -> None:
        for held in list(self._held.values()):
            if held.reason is None and not held.finishing:
                held.reason = reason
                held.task.cancel()

    def mark(self, claimed: Claimed, reason: str) -> bool:
        """Record why the attempt is about to be stopped by its owner: "shutdown", or for an
        attempt claimed ahead and handed back before it starts, "overdue" (it waited too
        long) or "limited" (its queue uses flow control); False if it is being stopped
        already, or is over."""
        held = self._held.get(claimed.key)
        if held is None or held.reason is not None or held.finishing:
            return False
        held.reason = reason
        return True

    async def run(self) -> None:
        """Beat every ``interval`` seconds until cancelled, and stop the handlers whose
        leases could not be renewed in time."""
        guard, worker = min(self._interval, 1.0), self._worker_id
        await asyncio.gather(
            every(self._interval, self.beat, what="heartbeat", worker_id=worker),
            every(guard, lambda: self._expiring(guard), what="lease guard", worker_id=worker),
        )

    async def _expiring(self, margin: float) -> None:
        """Stop, as lost, the handlers whose leases run out within ``margin`` seconds unrenewed
        (the database out of reach): past their lease another worker may run the task."""
        now = asyncio.get_running_loop().time()
        for h in list(self._held.values()):
            if h.reason is None and not h.finishing and h.renewed + self._lease - margin <= now:
                h.reason = "lost"
                h.task.cancel()
                logger.warning(
                    "%s: its lease could not be renewed for %.3g s (the database is out of "
                    "reach); the handler is stopped before the lease runs out, as another "
                    "worker may then run the task",
                    h.claimed,
                    now - h.renewed,
                    extra=h.claimed.log_fields(),
                )

    async def beat(self) -> None:
        """Record this worker as live, renew its leases, and stop handlers that lost theirs."""
        held = list(self._held.values())
        q = self._database.queries
        sent = asyncio.get_running_loop().time()
        async with self._database.acquire() as conn:
            await self._present(conn)
            if not held:
                return
            owned = await db.task_heartbeat(
                conn, q, db.Fence.of(h.claimed for h in held), self._lease
            )
        lost = []
        for h in held:
            if h.claimed.key in owned:
                h.renewed = sent
            if h.finishing:
                continue  # its outcome may have deleted the task just now
            if h.claimed.key not in owned and self._held.get(h.claimed.key) is h:
                # Cancelled run, reclaimed lease or expired deadline: stop the handler.
                h.reason = "lost"
                h.task.cancel()
                lost.append(h.claimed)
        for claimed in lost:  # rare: worth a read to say why
            async with self._database.acquire() as conn:
                state = await db.run_status(conn, q, claimed.run_id)
            _log_lost(claimed, state)


def _log_lost(claimed: Claimed, state: str | None) -> None:
    """Say why a running attempt lost its task: its run ended, or its lease was taken over."""
    log = claimed.log_fields()
    if state in ("cancelled", "failed"):
        logger.info(
            "%s stopped: its run is %s (cancelled, past its deadline, or another node failed)",
            claimed,
            state,
            extra=log,
        )
    else:
        logger.warning(
            "%s lost its lease: it ran out before this worker renewed it, and the task went "
            "back to its queue; the handler is cancelled and its writes rolled back (a "
            "handler that blocks the event loop delays renewals: move blocking work to a "
            "thread)",
            claimed,
            extra=log,
        )
