"""The slots of one queue, and the attempts claimed ahead that wait for one.

A queue runs at most ``limit`` handlers at once: one per slot. While its handlers are short,
a claim may also take tasks beyond the free slots (``ahead.py`` says how many); each such
attempt gets a *turn*, a future that a slot resolves when it frees, first claimed first. An
attempt claimed ahead is in one of these states::

    waiting --(a slot frees)------------------------------> started (holds the slot)
       |
       +--(AHEAD_WAIT passed, its queue is limited, or
       |   the worker stops: its turn is cancelled)-------> handed back (not run)
       |
       +--(its task is lost meanwhile: the heartbeat
           marks it, and cancels its turn)----------------> lost (never runs)

A handed-back or lost attempt writes its outcome without a slot (``attempt.py``, which
also marks why it hands one back); a started one frees its slot when its handler ends, which
passes it to the next turn still waiting, or else makes it free.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

from cyclone._worker.outcomes import Claimed

AHEAD_WAIT = 1.0
"""Seconds a task claimed ahead waits for a slot before it goes back to its queue (its
queue's handlers were not short after all); the queue then claims nothing ahead until they
are again."""


class Slots:
    """The ``limit`` slots of one queue: how many are taken, and the turns of the attempts
    claimed ahead that wait for one."""

    __slots__ = ("_waiting", "limit", "running")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.running = 0
        """Slots taken by attempts (started, or given a slot by :meth:`take`)."""
        self._waiting: dict[asyncio.Future[None], Claimed] = {}  # in claim order

    @property
    def waiting(self) -> int:
        """How many attempts claimed ahead wait for a slot."""
        return len(self._waiting)

    def take(
        self, claimed: Claimed, loop: asyncio.AbstractEventLoop
    ) -> asyncio.Future[None] | None:
        """A slot for ``claimed`` if one is free (None), else its turn, to wait for."""
        if self.running < self.limit:
            self.running += 1
            return None
        turn: asyncio.Future[None] = loop.create_future()
        self._waiting[turn] = claimed
        return turn

    def free(self) -> None:
        """A slot's attempt ended: the slot passes to the first turn still waiting, or is
        free."""
        while self._waiting:
            turn = next(iter(self._waiting))
            del self._waiting[turn]
            if not turn.done():  # a cancelled turn (handed back, lost) gives way
                turn.set_result(None)
                return
        self.running -= 1

    def withdraw(self, turn: asyncio.Future[None]) -> None:
        """Forget ``turn``, cancelled before a slot came to it."""
        self._waiting.pop(turn, None)

    def still_waiting(self, turns: list[asyncio.Future[None]]) -> list[asyncio.Future[None]]:
        """Those of ``turns`` that no slot has come to yet."""
        return [t for t in turns if t in self._waiting]

    def waiting_in(
        self, turns: list[asyncio.Future[None]] | None
    ) -> Iterator[tuple[asyncio.Future[None], Claimed]]:
        """Those of ``turns`` (None: every one) that still wait, with their attempts: the
        turns to cancel to hand them back."""
        for turn in list(self._waiting) if turns is None else turns:
            claimed = self._waiting.get(turn)
            if claimed is not None and not turn.done():
                yield turn, claimed
