"""Writes the outcome of each attempt: batched completions, retries, failures.

Every write is fenced by the attempt's claim token: a completion from an attempt whose task
was reclaimed or cancelled matches no row and is rejected. Plain completions (no completion
transaction) are gathered into batches, each one transaction of a few statements however
many completions it holds.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
import traceback
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from cyclone import _codec, _transitions
from cyclone import _queries as db
from cyclone._context import CompletionTx
from cyclone._notifier import queue_payload
from cyclone._sql import Queries
from cyclone._transitions import Effects

logger = logging.getLogger("cyclone")

_TRACEBACK_LIMIT = 8000
_MESSAGE_LIMIT = 2000
_WRITE_TRIES = 5


@dataclass(frozen=True, slots=True)
class Claimed:
    """A task this worker claimed: one attempt of a job or workflow node."""

    id: int
    run_id: uuid.UUID
    node: str | None
    kind: str
    queue: str
    attempt: int
    max_attempts: int
    claims: int
    run_name: str
    input: str
    deps: str | None
    trace: str | None = None
    worker: str = ""

    def __str__(self) -> str:
        """``attempt 2/5 of order.reserve (run ..., node reserve)``, for log messages."""
        return describe_attempt(self.attempt, self.max_attempts, self.kind, self.run_id, self.node)

    @property
    def key(self) -> tuple[int, int]:
        """The attempt's identity: its task and the claim that started it."""
        return (self.id, self.claims)

    def span_attributes(self) -> dict[str, Any]:
        """Attributes for the handler's span."""
        return {
            "cyclone.run_id": str(self.run_id),
            "cyclone.kind": self.kind,
            "cyclone.node": self.node or "",
            "cyclone.attempt": self.attempt,
            "cyclone.queue": self.queue,
        }

    def log_fields(self) -> dict[str, Any]:
        """Structured fields for log records (``extra``): the keys docs/observability.md lists."""
        return {
            "run_id": str(self.run_id),
            "kind": self.kind,
            "node": self.node,
            "attempt": self.attempt,
            "max_attempts": self.max_attempts,
            "queue": self.queue,
            "worker": self.worker,
        }


def describe_attempt(
    attempt: int, max_attempts: int, kind: str, run_id: uuid.UUID, node: str | None
) -> str:
    """How log messages name an attempt: ``attempt 2/5 of order.reserve (run ..., node x)``."""
    where = "" if node is None else f", node {node}"
    return f"attempt {attempt}/{max_attempts} of {kind} (run {run_id}{where})"


def error_record(claimed: Claimed, exc: BaseException, *, kind: str | None = None) -> str:
    """The JSON kept for a failed attempt: type, message, traceback, time."""
    tb = "".join(traceback.format_exception(exc))
    return _codec.encode_plain(
        {
            "attempt": claimed.attempt,
            "type": kind or type(exc).__qualname__,
            # jsonb cannot store NUL or lone surrogates; an error that could not be stored
            # would be lost, and one of any size would bloat every read of the run.
            "message": _codec.storable_text(str(exc), _MESSAGE_LIMIT),
            "traceback": _codec.storable_text(tb, _TRACEBACK_LIMIT),
            "at": dt.datetime.now(dt.UTC).isoformat(),
        }
    )


@dataclass(slots=True)
class _Pending:
    claimed: Claimed
    output: str
    done: asyncio.Future[bool]


class Completer:
    """Writes attempt outcomes for one worker and announces what they changed."""

    def __init__(
        self,
        pool: Any,
        queries: Queries,
        publish: Callable[[list[str]], None],
        *,
        batch_size: int = 200,
    ) -> None:
        self._pool = pool
        self._q = queries
        self._publish = publish
        self._batch_size = batch_size
        self._queue: asyncio.Queue[_Pending] = asyncio.Queue()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Start the batching loop."""
        self._task = asyncio.get_running_loop().create_task(self._run(), name="cyclone-completer")

    async def stop(self) -> None:
        """Write what is queued, then stop."""
        if self._task is None:
            return
        await self._queue.join()
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        self._task = None

    async def complete(self, claimed: Claimed, output: str) -> bool:
        """Queue a completion for the next batch; whether it was accepted (still owned)."""
        done: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._queue.put_nowait(_Pending(claimed, output, done))
        # A waiter cancelled meanwhile leaves ``done`` cancelled; the batch is written anyway
        # and skips setting it.
        return await done

    async def _run(self) -> None:
        while True:
            batch = [await self._queue.get()]
            while len(batch) < self._batch_size and not self._queue.empty():
                batch.append(self._queue.get_nowait())
            try:
                accepted = await self._write_batch(batch)
                for item in batch:
                    if not item.done.done():
                        item.done.set_result(item.claimed.key in accepted)
            except Exception as exc:  # supervised loop: report to each waiter, keep going
                for item in batch:
                    if not item.done.done():
                        item.done.set_exception(exc)
            finally:
                for _ in batch:
                    self._queue.task_done()

    async def _write_batch(self, batch: list[_Pending]) -> set[tuple[int, int]]:
        """Write a batch: workflow nodes in one transaction, then jobs in one statement.

        Two transactions, so that neither holds task locks out of id order while the
        heartbeat takes them in order (that could deadlock).
        """
        accepted: set[tuple[int, int]] = set()
        for group in (
            [p for p in batch if p.claimed.node is not None],
            [p for p in batch if p.claimed.node is None],
        ):
            if group:
                accepted |= await self._write_group(group)
        return accepted

    async def _write_group(self, group: list[_Pending]) -> set[tuple[int, int]]:
        items = [(p.claimed, p.output) for p in group]
        for attempt in range(1, _WRITE_TRIES + 1):
            try:
                async with self._pool.acquire() as conn:
                    if group[0].claimed.node is not None:
                        async with conn.transaction():
                            accepted, effects = await self._write(conn, items)
                    else:  # jobs only: one statement, its own transaction
                        accepted, effects = await self._write(conn, items)
                    if attempt > 1:
                        # The failed try may have committed before its reply was lost: then
                        # this one found its tasks gone. Ask the record, not the tasks.
                        await self._confirm(conn, items, accepted, effects)
                    # Committed: announce it now rather than after the pool's reset round trip.
                    self._publish(effects.payloads())
                return accepted
            except db.RETRYABLE_ERRORS as exc:
                if attempt == _WRITE_TRIES:
                    raise
                logger.warning(
                    "writing %d completions (first: %s) failed: %s; trying again (%d of %d)",
                    len(group),
                    group[0].claimed,
                    exc,
                    attempt + 1,
                    _WRITE_TRIES,
                    extra={**group[0].claimed.log_fields(), "count": len(group)},
                )
                await asyncio.sleep(0.1 * 2**attempt)
        raise AssertionError("unreachable")

    async def _confirm(
        self,
        conn: db.Conn,
        items: Sequence[tuple[Claimed, str]],
        accepted: set[tuple[int, int]],
        effects: Effects,
    ) -> None:
        """Count as accepted the attempts an earlier try completed; their jobs' runs ended.

        (What a node's completion released was announced by nobody; polling finds it.)
        """
        unsure = [c for c, _ in items if c.key not in accepted]
        if not unsure:
            return
        done = await db.attempts_completed(
            conn,
            self._q,
            [c.run_id for c in unsure],
            [c.node for c in unsure],
            [c.id for c in unsure],
            [c.claims for c in unsure],
        )
        for c in unsure:
            if (c.run_id, c.node) in done:
                accepted.add(c.key)
                if c.node is None:
                    effects.ended.add(c.run_id)

    async def _write(
        self, conn: db.Conn, items: Sequence[tuple[Claimed, str]]
    ) -> tuple[set[tuple[int, int]], Effects]:
        """Write completions (attempt, output) on ``conn``; the (task, claims) accepted and what
        to announce."""
        jobs = [(c, out) for c, out in items if c.node is None]
        nodes = [(c, out) for c, out in items if c.node is not None]
        accepted: set[tuple[int, int]] = set()
        effects = Effects()
        if nodes:
            await db.run_lock_many(conn, self._q, [c.run_id for c, _ in nodes])
            rows = await db.node_finish_many(conn, self._q, *_columns(nodes))
            accepted.update((r["id"], r["claims"]) for r in rows)
            effects.merge(
                await _transitions.advance(
                    conn, self._q, [r["run_id"] for r in rows], [r["node"] for r in rows]
                )
            )
        if jobs:
            rows = await db.job_complete_many(conn, self._q, *_columns(jobs))
            accepted.update((r["id"], r["claims"]) for r in rows)
            effects.ended.update(r["run_id"] for r in rows)
        return accepted, effects

    async def complete_in(self, completion: CompletionTx, claimed: Claimed, output: str) -> bool:
        """Complete inside the handler's completion transaction and commit it all together.

        A rejected completion (the attempt lost its task) rolls everything back, business
        writes included.
        """
        conn = completion.connection
        try:
            accepted, effects = await self._write(conn, [(claimed, output)])
        except BaseException:
            await completion.rollback()
            raise
        if not accepted:
            await completion.rollback()
            return False
        await completion.commit()
        queues = [queue_payload(q) for q in completion.wakeups.take()]
        self._publish(effects.payloads() + queues)
        return True

    async def retry(
        self, claimed: Claimed, *, delay: float, error: str | None, refund: bool
    ) -> bool:
        """Make the task available again after ``delay``; whether the attempt still owned it."""
        async with self._pool.acquire() as conn:
            rows = await db.task_retry_many(
                conn,
                self._q,
                [claimed.run_id],
                [claimed.id],
                [claimed.claims],
                [delay],
                [error],
                [refund],
            )
        if rows and delay <= 0:
            self._publish([queue_payload(claimed.queue)])
        return bool(rows)

    async def fail(self, claimed: Claimed, error: str) -> bool:
        """Fail the attempt for good: the job or node fails, and the run with it."""
        async with self._pool.acquire() as conn, conn.transaction():
            owned, effects = await _transitions.fail_node_or_job(
                conn,
                self._q,
                task_id=claimed.id,
                claims=claimed.claims,
                run_id=claimed.run_id,
                node=claimed.node,
                error=error,
                expired_only=False,
            )
        self._publish(effects.payloads())
        return owned


def _columns(
    items: Sequence[tuple[Claimed, str]],
) -> tuple[list[uuid.UUID], list[int], list[int], list[str]]:
    """Runs, task ids, claim tokens and outputs, as the completion statements take them."""
    return (
        [c.run_id for c, _ in items],
        [c.id for c, _ in items],
        [c.claims for c, _ in items],
        [out for _, out in items],
    )
