"""A worker's presence: its row in ``cyclone_workers`` and its liveness session.

The row says which worker runs and what it claims; every heartbeat renews it. The liveness
session is a connection of the worker's own (by the listener's route: straight to
PostgreSQL, never through a pooler in transaction mode) that holds a session-level advisory
lock for as long as the worker lives, and the row names that lock. When the process dies
the server ends the session at once and the lock is free: every peer's rescue probe, once a
second, sees it, and ``task_reclaim`` releases the lost worker's tasks then, each attempt
recorded as ``WorkerLost``, instead of waiting out its lease.

A worker whose session ends while it lives (the connection was cut, the server terminated
it) is taken for lost by its peers as well. So the moment it sees the session close, it
stops its running handlers and claims nothing more; it runs the rescue itself (its own
tasks among those released, should no peer be left), then takes its lock again on a new
session and claims again. A reclaim reads the locks inside its own statement, after taking
its snapshot: a task claimed once the lock is held again is invisible to it, or seen with
its worker live, so it is never released. Without a listener (``notify=False``) a worker
holds no lock and its row names none: its tasks wait for their leases, as do those of a
worker from before liveness.
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import socket
from collections.abc import Awaitable, Callable, Sequence

import asyncpg

from cyclone._model.errors import InvalidStateError
from cyclone._services.bundle import Services
from cyclone._storage import queries as db

logger = logging.getLogger("cyclone")

PRESENCE_BEATS = 3  # a row lives this many heartbeats past its last one
PROBE_INTERVAL = 1.0
"""Seconds between two looks of a worker for peers whose liveness session ended."""


class Presence:
    """The presence row and liveness session of the worker ``worker_id``, which claims from
    ``queues`` the ``kinds`` and nodes of ``workflows``; ``on_lost`` is called when its
    liveness session ends while it runs (it stops its handlers), and ``rescue`` (releasing
    lost workers' tasks) before it takes its lock again."""

    def __init__(
        self,
        services: Services,
        worker_id: str,
        claims: tuple[Sequence[str], Sequence[str], Sequence[str]],
        *,
        heartbeat: float,
        on_lost: Callable[[], None],
        rescue: Callable[[], Awaitable[None]],
    ) -> None:
        self._services = services
        self._worker_id = worker_id
        self._claims = claims
        self._ttl = heartbeat * PRESENCE_BEATS
        self._on_lost = on_lost
        self._rescue = rescue
        self._log = {"worker": worker_id}
        # The advisory lock (a random key under Cyclone's class) its session holds, if any.
        self.key = secrets.randbelow(2**31 - 1) + 1 if services.notifier is not None else None
        self.live = asyncio.Event()
        """Set while the worker may claim: its liveness session holds its lock (or it has none)."""
        self._session: asyncpg.Connection | None = None
        self._regain: asyncio.Task[None] | None = None
        self._stopped = False
        if self.key is None:
            self.live.set()

    async def start(self) -> None:
        """Take the liveness lock (before the first claim, and before the row names it),
        then record the worker as present. A worker started again under the id of one that
        died releases that one's tasks first (its row still names the old, free lock)."""
        if self.key is not None:
            await self._hold()
        try:
            async with self._services.database.acquire() as conn:
                if self.key is not None:
                    await self._check_twin(conn, self.key)
                    await self._rescue()
                await self.present(conn)
        except BaseException:
            await self._close()  # a failed start holds no session (the row is left alone)
            raise

    async def _check_twin(self, conn: db.Conn, key: int) -> None:
        if await db.worker_twin(conn, self._services.database.queries, self._worker_id, key):
            raise InvalidStateError(
                f"another live worker runs as {self._worker_id!r} (its session holds its "
                "liveness lock): give each worker its own worker_id, or stop the other "
                "first; two workers under one id would be rescued for each other's death"
            )

    async def present(self, conn: db.Conn) -> None:
        """Record this worker as live for a few more heartbeats, with what it claims."""
        queues, kinds, workflows = self._claims
        await db.worker_present(
            conn,
            self._services.database.queries,
            self._worker_id,
            socket.gethostname(),
            os.getpid(),
            list(queues),
            list(kinds),
            list(workflows),
            self._ttl,
            self.key,
        )

    async def leave(self) -> None:
        """Close the liveness session and remove the presence row (it would expire anyway)."""
        await self._close()
        try:
            async with self._services.database.acquire() as conn:
                await db.worker_leave(conn, self._services.database.queries, self._worker_id)
        except (*db.DATABASE_ERRORS, InvalidStateError) as exc:
            logger.warning(
                "worker %s: removing its presence row failed: %s; it expires in %.3g s",
                self._worker_id,
                exc,
                self._ttl,
                extra=self._log,
            )

    async def _close(self) -> None:
        self._stopped = True
        if self._regain is not None:
            self._regain.cancel()
        if self._session is not None:
            await self._session.close()

    async def probe(self) -> bool:
        """Whether a peer's liveness session has ended (its tasks are to be released now)."""
        async with self._services.database.acquire() as conn:
            lost = await db.workers_lost(conn, self._services.database.queries)
        return bool(lost)

    async def _hold(self) -> None:
        """Open a liveness session and take the lock on it, waiting while an old session of
        this worker that the server has not ended yet still holds it."""
        notifier = self._services.notifier
        assert notifier is not None and self.key is not None
        session = await notifier.connect()
        try:
            while True:
                if await db.worker_liveness_hold(
                    session, self._services.database.queries, self.key
                ):
                    break
                await asyncio.sleep(PROBE_INTERVAL)  # the server ends the old session soon
        except BaseException:
            await session.close()
            raise
        session.add_termination_listener(self._ended)
        self._session = session
        self.live.set()

    def _ended(self, session: object) -> None:
        if session is not self._session or self._stopped:
            return
        self._session = None
        self.live.clear()
        logger.warning(
            "worker %s: its liveness session with the database ended; its peers now release "
            "its tasks, so it stops its running handlers and claims nothing until it holds "
            "its lock again",
            self._worker_id,
            extra=self._log,
        )
        self._on_lost()
        self._regain = asyncio.get_running_loop().create_task(
            self._take_again(), name="cyclone-liveness"
        )

    async def _take_again(self) -> None:
        while True:
            try:
                await self._rescue()  # its own tasks too, should no peer be left to
                await self._hold()
            except (*db.DATABASE_ERRORS, OSError) as exc:
                logger.warning(
                    "worker %s: releasing lost tasks or opening its liveness session failed: "
                    "%s; trying again in %.3g s",
                    self._worker_id,
                    exc,
                    PROBE_INTERVAL,
                    extra=self._log,
                )
                await asyncio.sleep(PROBE_INTERVAL)
                continue
            logger.info(
                "worker %s holds its liveness lock again and claims again",
                self._worker_id,
                extra=self._log,
            )
            return
