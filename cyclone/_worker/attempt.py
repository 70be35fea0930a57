"""An attempt's life in this worker, from the claim that made it to its reported outcome.

A producer claims tasks, takes a slot for each (or a turn, for a task claimed ahead: see
``slots.py``) and hands the claim's attempts to :meth:`Attempts.start`. From then on this is
the room that tells the lease keeper about the attempt: it holds the attempt's lease from
its start until its outcome is written, and marks why it hands back an attempt claimed
ahead that is not to run. (The executor only marks the end of a handler, and asks why one
was cancelled.)

::

    held (its lease kept)
      ├─> claimed ahead: first waits for its turn; handed back or lost instead, it is written
      │   without a slot, reported, and goes no further
      └─> runs in its slot (executor.py; a batch kind's joins a batch: batches.py)
            ─> an outcome value (outcomes.py)
            └─> written (completer.py): the slot frees once the outcome is buffered, or
                once the handler's completion transaction commits
                  └─> reported (executor.py: logs, observers); its lease dropped

A freed slot goes back to its queue's :class:`Lane`: it passes to the next turn waiting, and
the queue's producer may claim.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from cyclone._worker.ahead import Pace
from cyclone._worker.batches import Batches
from cyclone._worker.completer import Completer
from cyclone._worker.executor import Executor
from cyclone._worker.leases import LeaseKeeper
from cyclone._worker.outcomes import (
    Claimed,
    Completed,
    CompletionAborted,
    HandedBack,
    Lost,
    Outcome,
)
from cyclone._worker.slots import AHEAD_WAIT, Slots

logger = logging.getLogger("cyclone")


@dataclass(frozen=True, slots=True)
class Lane:
    """What the attempts of one queue share: its ``slots``, the ``pace`` of its handlers (how
    far it claims ahead), and ``freed``, called when one of its slots frees (its producer's:
    the slot passes on, and the producer may claim)."""

    slots: Slots
    pace: Pace
    freed: Callable[[], None]


class Attempts:
    """Runs the attempts of one worker's queues: ``executor`` runs each handler,
    ``completer`` writes each outcome, ``leases`` keeps each lease until it is written."""

    def __init__(
        self,
        executor: Executor,
        completer: Completer,
        leases: LeaseKeeper,
        batches: Batches | None = None,
    ) -> None:
        self._executor = executor
        self._completer = completer
        self._leases = leases
        self._batches = batches  # the attempts of batch kinds join a batch instead

    def start(
        self,
        lane: Lane,
        attempts: list[tuple[Claimed, asyncio.Future[None] | None]],
        turns: list[asyncio.Future[None]],
        *,
        stopping: bool,
    ) -> None:
        """Start the attempts of one claim of ``lane``'s queue, each with its turn if it was
        claimed ahead (``turns``: those turns). Those still waiting after AHEAD_WAIT go back
        to their queue; all of them at once if the worker is ``stopping``."""
        loop = asyncio.get_running_loop()
        for claimed, turn in attempts:
            task = loop.create_task(
                self._run(lane, claimed, turn), name=f"cyclone-task-{claimed.id}"
            )
            self._leases.hold(claimed, task)
        if turns and stopping:
            self.hand_back(lane, turns, "shutdown")
        elif turns:
            loop.call_later(AHEAD_WAIT, self._overdue, lane, turns)

    def hand_back(self, lane: Lane, turns: list[asyncio.Future[None]] | None, reason: str) -> None:
        """Hand back these attempts claimed ahead that still wait (None: every one of the
        lane), for ``reason`` ("shutdown", "overdue", "limited"). Their turn is cancelled, not
        their task: a task created in this pass of the event loop has not started, and one
        cancelled before it starts never runs its body."""
        for turn, claimed in lane.slots.waiting_in(turns):
            if self._leases.mark(claimed, reason):
                turn.cancel()
        if turns is None and reason == "shutdown" and self._batches is not None:
            self._batches.stop()  # and the items waiting for their batch

    async def _run(self, lane: Lane, claimed: Claimed, turn: asyncio.Future[None] | None) -> None:
        """One attempt: (claimed ahead: wait for a slot) run it in a slot, hand its outcome
        to the completer, report it."""
        if turn is not None and not await self._turn(lane, claimed, turn):
            return
        started = time.perf_counter()
        slot = _Slot(lane)
        try:
            if self._batches is not None and self._batches.serves(claimed.kind):
                outcome, written = await self._batches.run(claimed, lane.slots.limit)
            else:
                outcome, written = await self._executor.run(claimed), None
            lane.pace.timed(time.perf_counter() - started)
            if written is None:
                outcome, accepted = await self._write(outcome, slot)
            else:  # a batch's completion transaction committed it, or its rejection
                accepted = written
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
                return outcome, bool(await self._completer.commit([outcome]))  # in the slot
            except CompletionAborted as exc:  # nothing was written: the attempt failed
                outcome = self._executor.failure(outcome.claimed, exc)
        verdict = self._completer.submit(outcome)
        slot.free()
        return outcome, await verdict

    async def _turn(self, lane: Lane, claimed: Claimed, turn: asyncio.Future[None]) -> bool:
        """Wait until a slot passes to this attempt claimed ahead; False if it is not to
        run: it was handed back (written here: a stopping worker, a wait longer than
        AHEAD_WAIT, or the queue's flow control), or it lost its task."""
        try:
            await turn
            return True
        except asyncio.CancelledError:
            if turn.done() and not turn.cancelled():
                lane.freed()  # the slot came as it was cancelled: on to the next one
            else:
                lane.slots.withdraw(turn)
            reason = self._leases.reason(claimed)
            if reason is None:  # from outside: as a running attempt cancelled so
                self._leases.drop(claimed)
                self._executor.report(Lost(claimed), True, time.perf_counter())
                raise
        # Handed back (by a stopping worker, after AHEAD_WAIT, once a limit is in use), or lost.
        outcome: Outcome = Lost(claimed) if reason == "lost" else HandedBack(claimed, started=False)
        started = time.perf_counter()
        self._leases.finishing(claimed)  # the heartbeat must not cancel the hand-back
        try:
            _, accepted = await self._write(outcome, _Slot(None))
        except Exception as exc:  # as _run()'s: the lease runs out, it is reclaimed
            logger.error(
                "%s, claimed ahead: handing it back failed: %s: %s; the lease will run out",
                claimed,
                type(exc).__name__,
                exc,
                extra=claimed.log_fields(),
            )
            outcome, accepted = Lost(claimed), True
        finally:
            self._leases.drop(claimed)
        self._executor.report(outcome, accepted, started)
        return False

    def _overdue(self, lane: Lane, turns: list[asyncio.Future[None]]) -> None:
        """Hand back those of a claim's tasks claimed ahead that still wait for a slot after
        AHEAD_WAIT: the handlers in the slots took at least that long."""
        late = lane.slots.still_waiting(turns)
        if late:
            lane.pace.timed(AHEAD_WAIT)
            self.hand_back(lane, late, "overdue")


class _Slot:
    """One of the queue's slots, taken by an attempt until freed (once)."""

    __slots__ = ("_lane",)

    def __init__(self, lane: Lane | None) -> None:
        self._lane: Lane | None = lane

    def free(self) -> None:
        if self._lane is not None:
            self._lane.freed()
            self._lane = None
