"""The producer of one queue: claims as many tasks as it has room for, an attempt for each.

It claims when woken (a NOTIFY for its queue, handled in ``wake()`` itself when no claim is
in flight), by a freed slot after a full claim or a wakeup that found no room, by room made
in the completer's buffer, or by a jittered poll, the correctness floor when a notification
is lost. Room is the free slots, bounded by what the completer's buffer still takes: a slow
database slows claiming instead of piling up outcomes. A slot is taken from claim until the
handler returns (or its completion transaction commits); the completer writes the outcome
meanwhile.

Claiming ahead (unless the worker's ``claim_ahead`` is off): while the queue's handlers are
short (mean under ``AHEAD_BELOW``) and it uses no flow control, one claim at a time may
also take tasks with no free slot yet, within the limits of ``ahead.py``. Each waits for
the next slot freed, its lease kept; no more than ``limit`` handlers run at once, and the
next claim travels while the held tasks run. ``slots.py`` keeps the slots and the waiting
attempts, and draws the states of an attempt claimed ahead.

The producer only claims: it hands each claim's attempts over to ``attempt.py``, which runs
them, has their outcomes written and keeps their leases meanwhile, and calls :meth:`freed`
as each gives its slot up.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import logging
import time

from cyclone._services.database import Database, Held
from cyclone._services.loops import Poll, jittered, retry_delay
from cyclone._services.observe import Observers
from cyclone._storage import queries as db
from cyclone._worker.ahead import Pace, most_ahead
from cyclone._worker.attempt import Attempts, Lane
from cyclone._worker.completer import Completer
from cyclone._worker.gate import Gate
from cyclone._worker.outcomes import Claimed, Claiming
from cyclone._worker.slots import Slots

logger = logging.getLogger("cyclone")

# Claims of one queue in flight together: with more free slots than one claim takes
# (claim_batch), the next claim runs while the last one's attempts start.
CLAIMS_AT_ONCE = 2


class Producer:
    """Claims from queue ``name`` up to ``limit`` attempts at a time, and hands them to
    ``attempts``; ``completer`` is asked how many more outcomes its buffer takes."""

    def __init__(
        self,
        database: Database,
        observers: Observers,
        name: str,
        limit: int,
        claiming: Claiming,
        *,
        attempts: Attempts,
        completer: Completer,
    ) -> None:
        self._database = database
        self._observers = observers
        self.name = name
        self.limit = limit
        self._claiming = claiming
        self._attempts = attempts
        self._completer = completer
        # Its claims' connection, kept between claims (a second claim in flight pools one).
        self._connection = Held(database)
        self._wake = asyncio.Event()
        self._stopping = False
        self._slots = Slots(limit)
        self._reserved = 0  # slots held for the claims in flight (and tasks claimed ahead)
        self._pace = Pace()  # of its handlers: how far it may claim ahead
        self._lane = Lane(self._slots, self._pace, self.freed)  # what its attempts share
        self._claims: set[asyncio.Task[None]] = set()  # in flight
        self._last_claim_full = False
        self._failed = 0  # claims failed in a row (the database out of reach)
        self._held_back = False  # the completer's buffer had no room at the last look
        self._gate = Gate(self._wake)  # which claim to send, when a limit lets it claim
        # A pass (a wakeup, a poll) that started no claim, unanswered until one starts: with a
        # claim in flight, that may have begun before the work committed, it claims again
        # when the claim is back; without room, when a slot frees (not at the next poll).
        self._owed = False
        self._claiming_now = False  # run() has begun and not yet ended
        self._poll = Poll(self._wake)
        self._context = contextvars.copy_context()  # the claims', set by run()

    def wake(self) -> None:
        """Claim now: a NOTIFY for this queue arrived, the listener reconnected, or a drain
        asks. With no claim in flight the claim starts here, a pass of the event loop sooner
        than the producer's loop would start it; otherwise the loop claims again when the
        claim in flight is back."""
        if self._claiming_now and not (self._stopping or self._claims) and self._start_claims():
            self._poll.restart()  # the next poll is an interval from now
            return
        self._wake.set()

    def room_made(self) -> None:
        """The completer wrote a batch: claim now if its full buffer held claims back."""
        if self._held_back:
            self._wake.set()

    def stop(self) -> None:
        """Stop claiming (attempts already started go on; those claimed ahead and not
        started are handed back)."""
        self._stopping = True
        self._wake.set()
        self._attempts.hand_back(self._lane, None, "shutdown")

    def _ahead(self) -> int:
        """How many tasks claims may take beyond the free slots (module docstring): one claim
        at a time, a larger claim rather than a second (a claim's own cost is what it saves)."""
        if not (self._claiming.ahead and self._gate.plain) or self._claims or self._stopping:
            return 0
        return self._pace.ahead(self.limit)

    def _room(self) -> tuple[int, int]:
        """How many tasks the next claim may take, and how many of them would wait for a
        slot: free slots (and the claim-ahead allowance), bounded by the claim size and by
        what the completer's buffer still takes."""
        batch = self._claiming.claim_batch
        taken = self._slots.running + self._slots.waiting + self._reserved
        free = max(0, self.limit - taken)
        room = min(self.limit + self._ahead() - taken, batch)
        # Every task held, running ones too, will have an outcome to write.
        buffered = self._completer.room - taken
        self._held_back = buffered < room
        room = min(room, buffered)
        if self._slots.waiting and room < min(self.limit, most_ahead(self.limit), batch):
            return 0, 0  # the slots have work: claim ahead again in one claim, not one by one
        return room, max(0, room - free)

    async def run(self) -> None:
        """Claim until stopped; then wait for the claims in flight."""
        self._claiming_now = True
        # Claims run in this context, whoever starts them (wake() runs in an enqueuer's).
        self._context = contextvars.copy_context()
        try:
            await self._claim_until_stopped()
            await asyncio.gather(*self._claims, return_exceptions=True)
        finally:
            self._claiming_now = False
            self._gate.close()
            self._connection.release()  # a claim still in flight gives its connection back

    async def _claim_until_stopped(self) -> None:
        while not self._stopping:
            # Cleared before claiming: a wakeup that arrives during the claim is kept.
            self._wake.clear()
            if not self._start_claims():
                self._owed = True
            await self._poll.wait(self._poll_in)

    def _poll_in(self) -> float:
        return jittered(self._claiming.poll_interval)

    def _start_claims(self) -> bool:
        """Start a first claim, and more at once only while claims come back full; whether
        one was started."""
        loop = asyncio.get_running_loop()
        started = False
        while len(self._claims) < CLAIMS_AT_ONCE and (
            not self._claims or self._last_claim_full or self._gate.again_now()
        ):
            room, ahead = self._room()
            if room <= 0:
                break
            self._reserved += room
            claim, name = self._claim(room, ahead), f"cyclone-claim-{self.name}"
            task = loop.create_task(claim, name=name, context=self._context.copy())
            self._claims.add(task)
            # Ended by _claim_and_start once its rows are in, else (it failed, or was
            # cancelled, even before its first step) here.
            task.add_done_callback(functools.partial(self._claim_done, room))
            started = True
            self._owed = False
        return started

    async def _claim(self, limit: int, ahead: int) -> None:
        """Claim up to ``limit`` tasks (reserved by the caller; ``ahead`` of them beyond the
        free slots) and start an attempt for each."""
        try:
            await self._claim_and_start(limit, ahead)
        except db.DATABASE_ERRORS as exc:
            # A cut connection: claim again soon, backing off while the database is away.
            self._last_claim_full = False
            self._failed += 1
            self._gate.failed()
            delay = retry_delay(self._failed, self._claiming.poll_interval)
            asyncio.get_running_loop().call_later(delay, self._wake.set)
            logger.warning(
                "worker %s: claiming from queue %r failed: %s; trying again in %.3g s",
                self._claiming.worker_id,
                self.name,
                exc,
                delay,
                extra={"worker": self._claiming.worker_id, "queue": self.name},
            )

    def _claim_done(self, limit: int, task: asyncio.Task[None]) -> None:
        if task in self._claims:
            self._claim_ended(task, limit, again=not task.cancelled())

    def _claim_ended(self, task: asyncio.Task[None], limit: int, *, again: bool = True) -> None:
        """A claim of ``limit`` is back: claim again at once if more is probably waiting
        (not after a cancelled one: the worker is being torn down)."""
        self._reserved -= limit
        self._claims.discard(task)
        more = self._last_claim_full or self._gate.again_now() or self._owed
        if again and more and (self._stopping or not self._start_claims()):
            self._wake.set()

    async def _claim_and_start(self, limit: int, ahead: int) -> None:
        started = time.perf_counter()
        async with self._connection.use() as conn:
            rows = await self._take(conn, limit, ahead)
        self._failed = 0
        loop = asyncio.get_running_loop()
        attempts: list[tuple[Claimed, asyncio.Future[None] | None]] = []
        turns: list[asyncio.Future[None]] = []
        worker = self._claiming.worker_id
        for claimed in [Claimed.from_row(row, queue=self.name, worker=worker) for row in rows]:
            turn = self._slots.take(claimed, loop)
            if turn is not None:  # claimed ahead: it waits for a slot
                turns.append(turn)
            attempts.append((claimed, turn))
        self._observers.claimed(self.name, len(rows), time.perf_counter() - started)
        self._last_claim_full = len(rows) == limit
        # The next claim goes out before these attempts start (see freed).
        claim = asyncio.current_task()
        assert claim is not None
        self._claim_ended(claim, limit)
        self._attempts.start(self._lane, attempts, turns, stopping=self._stopping)

    async def _take(self, conn: db.Conn, limit: int, ahead: int) -> db.ClaimedRows:
        c = self._claiming
        return await self._gate.take(
            conn,
            self._database.queries,
            db.ClaimRequest(self.name, c.kinds, limit, c.lease, c.worker_id, c.workflows),
            ahead,
            # The queue uses flow control now: what this worker claimed ahead and has not
            # started goes back, for the limits to count (a limit counts it as running).
            limited=lambda: self._attempts.hand_back(self._lane, None, "limited"),
        )

    def freed(self) -> None:
        """One of this queue's attempts gave its slot up (``attempt.py``): the slot is free, or
        passes to the first attempt claimed ahead that waits."""
        self._slots.free()
        # A handler that does not wait passes its slot on within this pass of the event loop.
        # While attempts claimed ahead wait, the next claim goes out from here (once _room
        # allows it), not from the producer's own pass: that comes after all of them, when
        # the slots would already be idle. (A claim in flight is the one claim ahead.)
        ahead = bool(self._slots.waiting) and not self._claims and not self._stopping
        # More work is likely after a full claim, under a limit that will let it claim, or
        # while a pass is owed.
        wanted = self._last_claim_full or self._gate.held or self._owed or self._stopping
        if wanted and not (ahead and self._start_claims()):
            self._wake.set()
