"""What a producer knows of its queue's flow control, from its own claims: which claim
statement to send next, and when a claim that a limit held back may try again.

Two claim statements serve a queue (``sql/claim.sql``): ``task_claim_plain`` while the queue
uses no flow control (not paused, no limit on it or on a kind served, no keyed work), and
``task_claim`` while it does. The gate starts plain. The plain claim declines, claiming
nothing, once it finds flow control in use; the gate then sends ``task_claim`` until one of
those finds the queue free of it again (a resume, limits cleared, the keyed work gone), so
that a fleet goes back to the cheaper claim with its next claims, not after a timer.

A claim held back by a limit says when it can start more (``ClaimedRows.retry_in``): at once,
when a running task ends (the producer's freed slot claims then), or in so many seconds (a
rate's next token, a key's oldest start leaving its window). For the last, the gate wakes
the producer when they have passed, which may be long before its next poll.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable

from cyclone._storage import queries as db
from cyclone._storage.loader import Queries


class Gate:
    """The flow-control state of one producer's claims; see the module docstring."""

    def __init__(self, wake: asyncio.Event) -> None:
        self._wake = wake
        self.plain = True  # the next claim is the plain one (no flow control last seen)
        self.held = False  # the last claim was held back by a limit...
        self.retry_in: float | None = None  # ...and may start more in so many seconds
        self._retry: asyncio.TimerHandle | None = None  # the wakeup for retry_in, when due

    def again_now(self) -> bool:
        """The last claim was held back by a count already out of date: claim again now."""
        return self.held and self.retry_in == 0

    def failed(self) -> None:
        """The last claim failed: nothing is known of the limits until the next one."""
        self.held = False

    def close(self) -> None:
        """The producer stopped: no wakeup is due any more."""
        if self._retry is not None:
            self._retry.cancel()

    async def take(
        self,
        conn: db.Conn,
        queries: Queries,
        request: db.ClaimRequest,
        ahead: int,
        *,
        limited: Callable[[], None],
    ) -> db.ClaimedRows:
        """Claim as ``request`` asks, ``ahead`` of its tasks beyond the free slots: by the plain
        claim while the queue uses no flow control, else by ``task_claim``, which claims
        nothing ahead (a limit counts tasks claimed ahead as running). ``limited`` is called
        when the plain claim declines, before the full claim is sent."""
        if self.plain:
            rows = await db.task_claim_plain(conn, queries, request)
            if not rows.declined:
                self._came_back(rows)
                return rows
            self.plain = False
            limited()
        if request.limit - ahead <= 0:
            rows = db.ClaimedRows()
        else:
            within = dataclasses.replace(request, limit=request.limit - ahead)
            rows = await db.task_claim(conn, queries, within)
            self.plain = rows.plain
        self._came_back(rows)
        return rows

    def _came_back(self, rows: db.ClaimedRows) -> None:
        self.held, self.retry_in = rows.held, rows.retry_in
        if rows.held and rows.retry_in:
            if self._retry is not None:
                self._retry.cancel()
            self._retry = asyncio.get_running_loop().call_later(rows.retry_in, self._wake.set)
