"""The producer of one queue: claims as many tasks as it has room for and runs an attempt
for each.

It claims when woken by a NOTIFY for its queue, by a freed slot after a full claim (more is
probably waiting), by room made in the completer's buffer, or by a jittered poll, which is
the correctness floor when a notification is lost. Room is the queue's free slots, bounded
by what the completer's buffer still takes: outcomes waiting to be written hold back
claims, so a slow database slows claiming instead of piling up outcomes.

A slot is taken from claim until the handler returns (or, when it opened a completion
transaction, until that commits with its completion); the outcome is then written by the
completer while the slot runs another attempt.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

from cyclone import _queries as db
from cyclone._attempt import Claimed, Completed, CompletionAborted, Lost, Outcome
from cyclone._completer import Completer
from cyclone._database import Database, Held
from cyclone._executor import Executor
from cyclone._leases import LeaseKeeper
from cyclone._loops import jittered, wait_woken
from cyclone._observe import Observers

logger = logging.getLogger("cyclone")

# Claims of one queue in flight together: with more free slots than one claim takes
# (claim_batch), the next claim runs while the last one's attempts start.
CLAIMS_AT_ONCE = 2
# Once the plain claim declined (the queue uses flow control), claims are task_claim's for
# this many seconds before the plain claim is tried again: a limit removed shows by then.
PLAIN_RETRY = 5.0


@dataclass(frozen=True)
class Claiming:
    """How every producer of a worker claims: as ``worker_id``, tasks of ``kinds`` and nodes
    of ``workflows``, each for a lease of ``lease`` seconds, at most ``claim_batch`` a claim,
    polling every ``poll_interval`` seconds at the latest."""

    worker_id: str
    kinds: list[str]
    workflows: list[str]
    lease: float
    claim_batch: int
    poll_interval: float


class Producer:
    """Claims from queue ``name`` up to ``limit`` attempts at a time."""

    def __init__(
        self,
        database: Database,
        observers: Observers,
        name: str,
        limit: int,
        claiming: Claiming,
        *,
        executor: Executor,
        completer: Completer,
        leases: LeaseKeeper,
    ) -> None:
        self._database = database
        self._observers = observers
        self.name = name
        self.limit = limit
        self._claiming = claiming
        self._executor = executor
        self._completer = completer
        self._leases = leases
        # Its claims' connection, kept from one claim to the next (a second claim in flight
        # takes one from the pool).
        self._connection = Held(database)
        self._wake = asyncio.Event()
        self._stopping = False
        self._running = 0  # slots taken by attempts
        self._reserved = 0  # slots held for the claims in flight
        self._claims: set[asyncio.Task[None]] = set()  # in flight
        self._last_claim_full = False
        self._held_back = False  # the completer's buffer had no room at the last look
        # Flow control: the last claim was held back by a limit, and may try again in
        # retry_in seconds (0: at once; None: when a task ends). See ClaimedRows in
        # _queries/claim.py.
        self._held = False
        self._retry_in: float | None = None
        self._missed = False  # a wakeup came while a claim was in flight
        self._plain_at = 0.0  # the loop's time from which to try the plain claim again

    def wake(self) -> None:
        """Claim now (a NOTIFY for this queue, a reconnected listener, a drain)."""
        self._wake.set()

    def room_made(self) -> None:
        """The completer wrote a batch: claim now if its full buffer held claims back."""
        if self._held_back:
            self._wake.set()

    def stop(self) -> None:
        """Stop claiming (attempts already started go on)."""
        self._stopping = True
        self._wake.set()

    def _room(self) -> int:
        """How many tasks the next claim may take: free slots, bounded by the claim size and
        by what the completer's buffer still takes."""
        room = min(self.limit - self._running - self._reserved, self._claiming.claim_batch)
        buffered = self._completer.room - self._reserved
        self._held_back = buffered < room
        return min(room, buffered)

    async def run(self) -> None:
        """Claim until stopped; then wait for the claims in flight."""
        try:
            await self._claim_until_stopped()
            await asyncio.gather(*self._claims, return_exceptions=True)
        finally:
            self._connection.release()  # a claim still in flight gives its connection back

    async def _claim_until_stopped(self) -> None:
        loop = asyncio.get_running_loop()
        while not self._stopping:
            # Cleared before claiming: a wakeup that arrives during the claim is kept.
            self._wake.clear()
            # A first claim on every wakeup; more at once only while claims come back full.
            started = False
            while len(self._claims) < CLAIMS_AT_ONCE and (
                not self._claims or self._last_claim_full or self._claim_again()
            ):
                room = self._room()
                if room <= 0:
                    break
                self._reserved += room
                task = loop.create_task(self._claim(room), name=f"cyclone-claim-{self.name}")
                self._claims.add(task)
                started = True
            # Woken while a claim was in flight that may have begun before the work it was
            # woken for committed: claim again once that claim is back.
            self._missed = self._missed or (not started and bool(self._claims))
            timeout = jittered(self._claiming.poll_interval)
            if self._held and self._retry_in:  # flow control: the next token is due then
                timeout = min(timeout, self._retry_in)
            await wait_woken(self._wake, timeout)

    async def _claim(self, limit: int) -> None:
        """Claim up to ``limit`` tasks (slots reserved by the caller) and start an attempt for
        each."""
        try:
            await self._claim_and_start(limit)
        except db.DATABASE_ERRORS as exc:
            self._last_claim_full = False  # back off to the poll while it is down
            self._held = False
            logger.warning(
                "worker %s: claiming from queue %r failed: %s; trying again at the next poll",
                self._claiming.worker_id,
                self.name,
                exc,
                extra={"worker": self._claiming.worker_id, "queue": self.name},
            )
        finally:
            self._reserved -= limit
            self._claims.discard(asyncio.current_task())
            if self._last_claim_full or self._claim_again() or self._missed:
                self._missed = False
                self._wake.set()  # more is probably waiting: claim again

    async def _claim_and_start(self, limit: int) -> None:
        started = time.perf_counter()
        async with self._connection.use() as conn:
            rows = await self._take(conn, limit)
            loop = asyncio.get_running_loop()
            for row in rows:
                claimed = Claimed.from_row(row, queue=self.name, worker=self._claiming.worker_id)
                self._running += 1
                task = loop.create_task(self._attempt(claimed), name=f"cyclone-task-{claimed.id}")
                self._leases.hold(claimed, task)
        self._observers.claimed(self.name, len(rows), time.perf_counter() - started)
        self._last_claim_full = len(rows) == limit
        self._held, self._retry_in = rows.held, rows.retry_in  # flow control

    async def _take(self, conn: db.Conn, limit: int) -> db.ClaimedRows:
        """Claim up to ``limit`` tasks: by the plain claim while the queue uses no flow
        control, by the full one (``task_claim``) while it does."""
        c = self._claiming
        args = (self.name, c.kinds, limit, c.lease, c.worker_id, c.workflows)
        q = self._database.queries
        loop = asyncio.get_running_loop()
        if loop.time() >= self._plain_at:
            rows = await db.task_claim_plain(conn, q, *args)
            if not rows.declined:
                return rows
            self._plain_at = loop.time() + PLAIN_RETRY
        return await db.task_claim(conn, q, *args)

    def _claim_again(self) -> bool:
        """Flow control: the last claim was held back by a count already out of date."""
        return self._held and self._retry_in == 0

    async def _attempt(self, claimed: Claimed) -> None:
        """One attempt: run it in a slot, hand its outcome to the completer, report it."""
        started = time.perf_counter()
        slot = _Slot(self)
        try:
            outcome = await self._executor.run(claimed)
            outcome, accepted = await self._write(outcome, slot)
        except asyncio.CancelledError:  # from outside: nothing written, the lease runs out
            self._executor.report(Lost(claimed), True, started)
            raise
        except Exception as exc:  # supervised: whatever went wrong, the worker goes on
            logger.error(
                "%s: writing its outcome failed: %s: %s; the lease will run out and the "
                "attempt is then reclaimed",
                claimed,
                type(exc).__name__,
                exc,
                exc_info=exc,
                extra=claimed.log_fields(),
            )
            self._executor.report(Lost(claimed), True, started)  # as cancelled: not written
            return
        finally:
            slot.free()
            self._leases.drop(claimed)
        self._executor.report(outcome, accepted, started)

    async def _write(self, outcome: Outcome, slot: _Slot) -> tuple[Outcome, bool]:
        """Have the completer write the outcome: the outcome as written, and whether the
        database accepted it."""
        if isinstance(outcome, Lost):
            return outcome, True  # nothing to write: the task is no longer this attempt's
        if isinstance(outcome, Completed) and outcome.completion is not None:
            try:
                return outcome, await self._completer.commit(outcome)  # in the slot
            except CompletionAborted as exc:  # nothing was written: the attempt failed
                outcome = self._executor.failure(outcome.claimed, exc)
        verdict = self._completer.submit(outcome)
        slot.free()
        return outcome, await verdict

    def freed(self) -> None:
        """One of this queue's attempts ended: its slot is free (via its :class:`_Slot`)."""
        self._running -= 1
        if self._last_claim_full or self._held or self._stopping:
            self._wake.set()  # held by a limit: a slot this worker held is free now


class _Slot:
    """One of the queue's slots, taken by an attempt until freed (once)."""

    __slots__ = ("_producer",)

    def __init__(self, producer: Producer) -> None:
        self._producer: Producer | None = producer

    def free(self) -> None:
        if self._producer is not None:
            self._producer.freed()
            self._producer = None
