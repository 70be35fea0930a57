"""The batch writer of attempt outcomes: the one place they reach the database.

Outcomes wait in a bounded buffer and are written in batches by a few writers at once, each
on its own connection, a few statements per batch however many outcomes it holds: workflow
node completions in one transaction, job completions in one statement, tasks put back in
their queue in one statement, failures one at a time (they are rare, and each fails its
run). What each of those statements does is ``writes.py``'s; this module decides when, on
which connection and how often. A write that loses its connection is tried again, with
backoff, until the database answers, or until a stopping worker gives up on it; if an
earlier try may have committed before its reply was lost, the record says whether it did.
Each outcome is reported as accepted or rejected, so nobody reports what the database
refused, and what a committed write changed is announced.

A completion inside the handler's completion transaction is written on that connection and
committed with the handler's writes, at once (its queue slot waits for the commit).

The buffer is bounded: :attr:`Completer.room` tells producers how many more outcomes it takes
before they must hold back their claims.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import asyncpg

from cyclone._model.errors import InvalidStateError, SchemaNotMigratedError
from cyclone._services import loops
from cyclone._services.database import Database, Held
from cyclone._services.publisher import Publisher
from cyclone._services.transitions import Effects
from cyclone._storage import queries as db
from cyclone._worker.outcomes import (
    Completed,
    Failed,
    Outcome,
    Released,
    aborted_completion,
    lost_completion,
)
from cyclone._worker.writes import Accepted, OutcomeWrites, Spawn

logger = logging.getLogger("cyclone")

_BACKOFF_CAP = 2.0  # seconds between tries of a write while the database is unreachable
_LOG_EVERY = 10  # tries of one write between two warnings about it
_WRITERS = 3  # batches written at once, each on its own connection


# One group's write and its confirm (writes.py), as the batch writer calls them.
Write = Callable[[db.Conn, Sequence[Any]], Awaitable[tuple[Accepted, Effects]]]
Confirm = Callable[[db.Conn, Sequence[Any], Effects], Awaitable[Accepted]]


@dataclass(slots=True)
class _Pending:
    outcome: Outcome
    done: asyncio.Future[bool]


class Completer:
    """Writes the outcomes of one worker's attempts and announces what they changed.

    ``bound`` is how many outcomes may wait unwritten; ``on_written`` is called after each
    batch (room was made); ``discard``: the kinds whose completed jobs keep nothing."""

    def __init__(
        self,
        database: Database,
        publisher: Publisher,
        *,
        bound: int,
        on_written: Callable[[], None] = lambda: None,
        batch_size: int = 200,
        spawn: Spawn | None = None,
        discard: frozenset[str] = frozenset(),
    ) -> None:
        self._database = database
        self._spawn = spawn  # made ready as an outcome arrives; submitted by the writes
        self._writes = OutcomeWrites(database.queries, spawn, discard)
        self._connections = Held(database, keep=_WRITERS)  # its writers', between batches
        self._publisher = publisher
        self._bound = bound
        self._on_written = on_written
        self._batch_size = batch_size
        self._buffer: list[_Pending] = []
        self._unwritten = 0
        self._arrived = asyncio.Event()
        self._drained = asyncio.Event()
        self._drained.set()
        self._writing = 0  # batches being written
        self._tasks: list[asyncio.Task[None]] = []
        self._give_up_at: float | None = None  # set by stop(): when to stop trying

    @property
    def room(self) -> int:
        """How many more outcomes the buffer takes before claims must wait."""
        return self._bound - self._unwritten

    def start(self) -> None:
        """Start the batching loop."""
        loop = asyncio.get_running_loop()
        self._tasks = [
            loop.create_task(self._run(), name=f"cyclone-completer-{i}") for i in range(_WRITERS)
        ]

    def give_up_after(self, seconds: float) -> None:
        """Stop trying writes that still fail ``seconds`` from now (a worker shutting down);
        their waiters get the error, and the attempts' leases run out."""
        self._give_up_at = asyncio.get_running_loop().time() + seconds

    async def stop(self) -> None:
        """Write what is buffered, then stop."""
        await self._drained.wait()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []
        self._connections.release()

    def submit(self, outcome: Completed | Released | Failed) -> asyncio.Future[bool]:
        """Buffer an outcome for the next batch; the future says whether it was accepted
        (the attempt still owned its task), or holds the error that stopped its write."""
        done: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        if self._spawn is not None and isinstance(outcome, Completed):
            self._spawn.prepare(outcome)  # before the batch's locks are taken
        self._buffer.append(_Pending(outcome, done))
        self._unwritten += 1
        self._drained.clear()
        self._arrived.set()
        return done

    async def _run(self) -> None:
        """One of the writers: takes what is buffered, as one batch, and writes it. While
        one batch waits for its commit, the next writer takes the outcomes that arrived
        meanwhile (a batch waits on the database, not on the event loop)."""
        while True:
            while not self._buffer:
                self._arrived.clear()
                await self._arrived.wait()
            batch = self._buffer[: self._batch_size]
            del self._buffer[: self._batch_size]
            self._writing += 1
            try:
                await self._write_batch(batch)
            except Exception as exc:  # supervised loop: report to each waiter, keep going
                for item in batch:
                    if not item.done.done():
                        item.done.set_exception(exc)
            finally:
                self._writing -= 1
                self._unwritten -= len(batch)
            self._on_written()
            if not self._buffer and not self._writing:
                self._drained.set()

    async def _write_batch(self, batch: list[_Pending]) -> None:
        """Write a batch, group by group, each in its own transaction or statement.

        Separate transactions, so that none holds task locks out of id order while the
        heartbeat takes them in order (that could deadlock).
        """
        nodes: list[_Pending] = []
        jobs: list[_Pending] = []
        released: list[_Pending] = []
        failed: list[_Pending] = []
        for item in batch:
            o = item.outcome
            if isinstance(o, Completed):
                (jobs if o.claimed.node is None else nodes).append(item)
            elif isinstance(o, Failed):
                failed.append(item)
            else:
                released.append(item)
        writes = self._writes
        if nodes:
            await self._persist(nodes, writes.complete_nodes, writes.confirm_completed, tx=True)
        if jobs:
            await self._persist(jobs, writes.complete_jobs, writes.confirm_completed, tx=False)
        if released:
            await self._persist(released, writes.release, writes.confirm_released, tx=False)
        for item in failed:  # one at a time: a node's failure locks and fails its run
            node = item.outcome.claimed.node is not None  # a job's is one statement
            await self._persist([item], writes.fail, writes.confirm_failed, tx=node)

    async def _persist(
        self, group: list[_Pending], write: Write, confirm: Confirm, *, tx: bool
    ) -> None:
        """Write one group, trying again on connection loss, and resolve its outcomes."""
        outcomes = [p.outcome for p in group]
        tries = 0
        while True:
            tries += 1
            try:
                async with self._connections.use() as conn:
                    if tx:
                        async with self._database.transaction(conn):
                            accepted, effects = await write(conn, outcomes)
                    else:  # one statement, its own transaction
                        accepted, effects = await write(conn, outcomes)
                    if tries > 1:
                        # An earlier try may have committed before its reply was lost: then
                        # this one found its tasks gone. Ask the record, not the tasks.
                        unsure = [o for o in outcomes if o.claimed.key not in accepted]
                        if unsure:
                            accepted |= await confirm(conn, unsure, effects)
                    # Committed: announce it (run ends may wait to share a NOTIFY).
                    self._publisher.announce(effects)
                break
            except db.RETRYABLE_ERRORS as exc:
                await self._before_next_try(outcomes, exc, tries)
        for item in group:
            if not item.done.done():  # its waiter may have been cancelled meanwhile
                item.done.set_result(item.outcome.claimed.key in accepted)

    async def _before_next_try(
        self, outcomes: list[Outcome], exc: BaseException, tries: int
    ) -> None:
        loop = asyncio.get_running_loop()
        if self._database.pool.is_closing():
            raise InvalidStateError("the client's asyncpg pool was closed before the worker")
        if self._give_up_at is not None and loop.time() >= self._give_up_at:
            raise exc
        delay = loops.retry_delay(tries, _BACKOFF_CAP)
        if tries == 1 or tries % _LOG_EVERY == 0:
            first = outcomes[0]
            logger.warning(
                "writing %d outcomes (first: the %s of %s) failed: %s: %s; trying again in "
                "%.3g s (try %d), until the database answers",
                len(outcomes),
                first.noun,
                first.claimed,
                type(exc).__name__,
                exc,
                delay,
                tries + 1,
                extra={**first.claimed.log_fields(), "count": len(outcomes)},
            )
        await asyncio.sleep(delay)

    # A completion in the handler's own transaction

    async def commit(self, outcomes: Sequence[Completed]) -> Accepted:
        """Complete inside the handlers' completion transaction (one, shared by every
        outcome: one attempt's, or a batch's) and commit it all together, only if every
        outcome is accepted; the attempts accepted (all of them: it committed).

        A rejected completion (an attempt lost its task) rolls everything back, business
        writes included; the attempts that still owned theirs are returned, uncommitted. A
        connection lost before the commit raises :class:`ConnectionLost` (nothing was
        written: the caller makes it the attempts' error); one lost during the commit is
        settled by the record. A statement or COMMIT the server refused (the handler left
        the transaction aborted, a deferred constraint failed) raises
        :class:`CompletionAborted`: the server rolled it back, so that is certain too.
        """
        completion = outcomes[0].completion
        assert completion is not None
        try:
            accepted, effects = await self._writes.complete(completion.connection, outcomes)
        except BaseException as exc:
            await asyncio.shield(completion.rollback())
            if isinstance(exc, db.RETRYABLE_ERRORS):
                raise lost_completion(exc) from exc
            if isinstance(exc, asyncpg.PostgresError | SchemaNotMigratedError):
                raise aborted_completion(exc) from exc
            raise
        if len(accepted) < len(outcomes):
            await completion.rollback()
            return accepted
        try:
            await completion.commit()
        except db.RETRYABLE_ERRORS as exc:
            # The commit may have gone through before the connection failed: ask the record.
            if not await self._committed_anyway(outcomes):
                raise lost_completion(exc) from exc
        except asyncpg.PostgresError as exc:  # refused at COMMIT: rolled back
            raise aborted_completion(exc) from exc
        effects.queues.update(completion.wakeups.take())
        self._publisher.announce(effects)
        return accepted

    async def _committed_anyway(self, outcomes: Sequence[Completed]) -> bool:
        """Whether the completions are in the record (all or none: they committed together),
        asked as often as it takes."""
        tries = 1
        while True:
            try:
                async with self._database.borrow() as conn:
                    found = await self._writes.confirm_completed(conn, outcomes, Effects())
                return bool(found)
            except db.RETRYABLE_ERRORS as exc:
                await self._before_next_try(list(outcomes), exc, tries)
                tries += 1
