"""A worker's presence: its row in ``cyclone_workers`` and its liveness session.

The row says which worker runs and what it claims; every heartbeat renews it. The liveness
session is a connection of the worker's own (by the listener's route: straight to
PostgreSQL, never through a pooler in transaction mode) that holds a session-level advisory
lock for as long as the worker lives, and the row names that lock. When the process dies
the server ends the session at once and the lock is free.

A free lock is not yet a death: a connection that was cut, or a server that terminated it,
frees the lock of a worker that lives. So a worker is taken for dead when its lock

- has stayed free past its grace (``liveness_grace``, 1 s by default), counted from the
  first time a peer saw it free (peers look twice a second, and again when a grace ends),
  with no sign of life from the worker meanwhile; or
- is free and a peer on the same machine (same boot, same pid namespace) finds its process
  gone (a peer elsewhere cannot tell, and waits out the grace).

Then any peer's rescue releases its running tasks at once, each attempt recorded as
``WorkerLost`` with the evidence (the worker, its host, pid and backend, its last
heartbeat, since when its lock was free, who released it), instead of waiting out their
leases.

A worker whose session ends while it lives keeps its running handlers (their leases are
renewed through its pool as before) and goes on claiming through its pool, and takes its
lock again on a new session at once, trying again quickly (from 50 ms, jittered). While it
cannot connect a session, it says it lives through its pool, which restarts its grace.
Should peers release its tasks all the same (it was cut off from the database past its
grace), its heartbeat finds those tasks gone and stops their handlers, and taking its lock
again tells it so: it logs the release and counts it as a rescue of a live worker. Every
outcome is fenced by its attempt's claim, so a late completion of a released attempt is
rejected.

A reclaim reads the locks inside its own statement, after taking its snapshot: a task claimed
once the lock is held again is invisible to it, or seen with its worker live, so it is never
released. Without a listener (``notify=False``) a worker holds no lock and its row names
none: its tasks wait for their leases, as do those of a worker from before liveness.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import os
import secrets
import socket
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import asyncpg

from cyclone._model.errors import InvalidStateError
from cyclone._services.bundle import Services
from cyclone._services.loops import retry_delay
from cyclone._storage import queries as db

logger = logging.getLogger("cyclone")

PRESENCE_BEATS = 3  # a row lives this many heartbeats past its last one
PROBE_INTERVAL = 0.5
"""Seconds between two looks of a worker for peers whose liveness lock is free."""
DEFAULT_GRACE = 1.0
"""Seconds a worker's lock may stay free before its peers take it for dead."""
_RELOCK_MOST = 0.5  # seconds at most between tries to take the lock again (inside the grace)


def machine_identity() -> str | None:
    """Where a pid names a process: this boot of this machine and this pid namespace; None
    where that cannot be read (not Linux), so peers never judge a pid of ours."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        namespace = os.readlink("/proc/self/ns/pid")
    except OSError:
        return None
    return f"{boot}/{namespace}"


def process_gone(pid: int) -> bool:
    """Whether no process ``pid`` runs on this machine (a zombie, dead but not yet reaped by
    its parent, counts as gone); False when in doubt."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:  # another user's process: it exists
        return False
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2 :].startswith("Z")


@dataclass(frozen=True, slots=True)
class Lookout:
    """What one look for lost peers found: whether to release tasks now (and the ids of the
    workers known dead, whatever their grace), and when to look again."""

    release: bool
    dead: list[str]
    again: float  # seconds


class Presence:
    """The presence row and liveness session of the worker ``worker_id``, which claims from
    ``queues`` the ``kinds`` and nodes of ``workflows``; ``grace`` is how long its lock may
    stay free before peers release its tasks, and ``rescue(dead)`` releases lost workers'
    tasks (those in ``dead`` without waiting for their grace)."""

    def __init__(
        self,
        services: Services,
        worker_id: str,
        claims: tuple[Sequence[str], Sequence[str], Sequence[str]],
        *,
        heartbeat: float,
        grace: float,
        rescue: Callable[[Sequence[str]], Awaitable[None]],
        on_rescued_alive: Callable[[], None],
    ) -> None:
        self._services = services
        self._worker_id = worker_id
        self._claims = claims
        self._ttl = heartbeat * PRESENCE_BEATS
        self._grace = grace
        self._rescue = rescue
        self._on_rescued_alive = on_rescued_alive
        self._machine = machine_identity()
        self._log = {"worker": worker_id}
        # The advisory lock (a random key under Cyclone's class) its session holds, if any.
        self.key = secrets.randbelow(2**31 - 1) + 1 if services.notifier is not None else None
        self.live = asyncio.Event()
        """Set while the worker may claim: its liveness session holds its lock (or it has none)."""
        self._session: asyncpg.Connection | None = None
        self._backend: int | None = None  # the server pid of the session
        self._regain: asyncio.Task[None] | None = None
        self._stopped = False
        if self.key is None:
            self.live.set()

    async def start(self) -> None:
        """Take the liveness lock (before the first claim, and before the row names it),
        then record the worker as present. A worker started again under the id of one that
        died releases that one's tasks first (its row still names the old, free lock)."""
        if self.key is not None:
            session = await self._connect()
            try:
                while not await db.worker_liveness_hold(  # noqa: ASYNC110 - another session holds it
                    session, self._services.database.queries, self.key
                ):
                    await asyncio.sleep(PROBE_INTERVAL)  # the server ends the old session soon
            except BaseException:
                await session.close()
                raise
            self._held(session)
        try:
            async with self._services.database.acquire() as conn:
                if self.key is not None:
                    await self._check_twin(conn, self.key)
                    await self._rescue([self._worker_id])  # its dead self of before
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
            backend=self._backend,
            machine=self._machine,
            grace=self._grace if self.key is not None else None,
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

    async def look(self) -> Lookout:
        """Look for peers whose lock is free (noting since when): release their tasks now if
        a grace has run out or a process is known gone; look again when the next grace ends,
        or in a second."""
        async with self._services.database.acquire() as conn:
            rows = await db.workers_unlocked(conn, self._services.database.queries)
        dead = [
            r["id"]
            for r in rows
            if r["id"] != self._worker_id
            and self._machine is not None
            and r["machine"] == self._machine
            and process_gone(r["pid"])
        ]
        # Its own row is left to its peers: it knows it lives, and says so while it can.
        waits = [_grace_left(r) for r in rows if r["id"] not in dead and r["id"] != self._worker_id]
        again = min([PROBE_INTERVAL, *(w for w in waits if w > 0)])
        return Lookout(bool(dead) or any(w <= 0 for w in waits), dead, max(again, 0.01))

    async def _connect(self) -> asyncpg.Connection:
        notifier = self._services.notifier
        assert notifier is not None
        return await notifier.connect()

    def _held(self, session: asyncpg.Connection) -> None:
        session.add_termination_listener(self._ended)
        self._session = session
        self._backend = session.get_server_pid()
        self.live.set()

    def _ended(self, session: object) -> None:
        if session is not self._session or self._stopped:
            return
        self._session = None
        self.live.clear()
        logger.warning(
            "worker %s: its liveness session with the database ended; it keeps its running "
            "handlers, claims nothing new, and takes its lock again (its peers release its "
            "tasks if its lock stays free past its grace of %.3g s)",
            self._worker_id,
            self._grace,
            extra=self._log,
        )
        self._regain = asyncio.get_running_loop().create_task(
            self._take_again(), name="cyclone-liveness"
        )

    async def _take_again(self) -> None:
        """Take the lock again on a new session, trying again quickly (jittered, so that
        the workers of a storm do not reconnect in step); between tries, say through the
        pool that the worker lives."""
        assert self.key is not None
        tries = 0
        while True:
            tries += 1
            try:
                if await self._relock(self.key):
                    return
            except (*db.DATABASE_ERRORS, OSError) as exc:
                logger.info(
                    "worker %s: opening its liveness session failed: %s; trying again",
                    self._worker_id,
                    exc,
                    extra=self._log,
                )
                await self._say_alive(self.key)
            await asyncio.sleep(retry_delay(tries, _RELOCK_MOST))

    async def _relock(self, key: int) -> bool:
        """One try to take the lock again; True once it is held."""
        session = await self._connect()
        try:
            row = await db.worker_relock(
                session, self._services.database.queries, self._worker_id, key
            )
        except BaseException:
            await session.close()
            raise
        if not row["ok"]:  # a session the server has not ended yet holds it: peers wait too
            await session.close()
            return False
        self._held(session)
        if row["released_at"] is not None:
            self._on_rescued_alive()
            logger.warning(
                "worker %s holds its liveness lock again, but worker %s took it for dead at "
                "%s and released its tasks (it was cut off from the database past its grace "
                "of %.3g s); the handlers of those tasks are stopped at its next heartbeat",
                self._worker_id,
                row["released_by"],
                row["released_at"].isoformat(),
                self._grace,
                extra=self._log,
            )
        else:
            logger.info(
                "worker %s holds its liveness lock again and claims again",
                self._worker_id,
                extra=self._log,
            )
        return True

    async def _say_alive(self, key: int) -> None:
        try:
            async with asyncio.timeout(self._grace):
                async with self._services.database.acquire() as conn:
                    await db.worker_alive(
                        conn, self._services.database.queries, self._worker_id, key
                    )
        except (*db.DATABASE_ERRORS, OSError, TimeoutError) as exc:
            logger.info(
                "worker %s: saying it lives through its pool failed too: %s",
                self._worker_id,
                exc,
                extra=self._log,
            )


def _grace_left(row: db.Record) -> float:
    """Seconds until the grace of a worker whose lock is free runs out (0 or less: now)."""
    grace, since, now = row["grace"], row["lock_free_since"], row["now"]
    if grace is None:  # a release that keeps no grace
        return 0.0
    if since is None:  # retaken as this look marked it (the mark was skipped): not lost yet
        return float(grace)
    left: dt.timedelta = since + dt.timedelta(seconds=grace) - now
    return left.total_seconds()
