"""The worker: claims tasks, runs handlers under leases, writes outcomes, keeps house.

One asyncio task per queue claims work (woken by NOTIFY, by a freed slot when the last claim
was full, or by a jittered poll that is the correctness floor). Each claimed task runs in its
own asyncio task under the queue's concurrency limit. A heartbeat extends the leases of every
running task in one statement and cancels handlers whose task is gone (run cancelled, lease
reclaimed). Maintenance reclaims expired leases and fails overdue runs and wait nodes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import socket
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import TYPE_CHECKING, Any

import msgspec

from cyclone import _codec
from cyclone import _maintenance as maintenance
from cyclone import _queries as db
from cyclone._completer import Claimed, Completer, error_record
from cyclone._context import CompletionTx, Context, Snooze
from cyclone._errors import InvalidInputError, InvalidStateError
from cyclone._kinds import Step
from cyclone._options import seconds, validate_int, validate_queue
from cyclone._scheduler import Scheduler
from cyclone._workflow import defined_workflows

if TYPE_CHECKING:
    from cyclone._client import Client
    from cyclone._schedules import Schedule
    from cyclone._workflow import Workflow

logger = logging.getLogger("cyclone")

DEFAULT_CONCURRENCY = 10
# A worker's presence row counts as live for this many heartbeats after its last write.
PRESENCE_BEATS = 3
# Warnings about a worker's configuration already given in this process, said once each.
_WARNED: set[str] = set()


def exponential_backoff(attempt: int, *, base: float = 1.0, cap: float = 3600.0) -> float:
    """Seconds before retrying after failed attempt ``attempt``: doubling, capped, jittered."""
    delay: float = min(cap, base * 2 ** (attempt - 1))
    return delay * random.uniform(0.5, 1.0)


@dataclass(slots=True)
class _Running:
    claimed: Claimed
    task: asyncio.Task[None]
    reason: str | None = None  # why we cancelled it: "lost", "shutdown"
    finishing: bool = False  # writing its outcome: its task may be gone by design


@dataclass(slots=True)
class _Queue:
    name: str
    limit: int
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    running: int = 0
    last_claim_full: bool = False
    # Flow control: the last claim was held back by a limit, and may try again in retry_in
    # seconds (0: at once; None: when a task ends). See ClaimedRows in _queries.py.
    held: bool = False
    retry_in: float | None = None


class Worker:
    """Runs the handlers of ``steps`` and of every step in ``workflows``.

    ``queues`` maps queue names to concurrency limits (default: each step's queue, 10).
    ``poll_interval`` bounds how long claimable work can wait when a notification is lost.
    ``lease`` is how long a claimed task stays this worker's without a heartbeat;
    ``heartbeat`` defaults to a third of it. ``shutdown_timeout`` is how long a graceful stop
    lets running handlers finish before cancelling them. ``start()`` waits (logged once) until
    the database answers, then checks the schema: :class:`SchemaNotMigratedError` if it lacks
    migrations, unless ``wait_for_schema`` is true, which waits (logged once) until they are
    applied; :class:`SchemaVersionError` always; :class:`UnsupportedPoolerError` behind
    PgBouncer in transaction mode with a setting that cannot work through it.
    ``schedules`` (from :func:`cyclone.schedule`) are declared at start and fired by this
    worker's timer, with the dynamic schedules of what it serves (docs/schedules.md).
    """

    def __init__(
        self,
        client: Client,
        *,
        steps: Sequence[Step[Any, Any]] = (),
        workflows: Sequence[Workflow[Any]] = (),
        queues: Mapping[str, int] | None = None,
        poll_interval: float = 1.0,
        lease: float = 30.0,
        heartbeat: float | None = None,
        shutdown_timeout: float = 10.0,
        maintenance_interval: float | None = None,
        claim_batch: int = 100,
        backoff: Callable[[int], float] = exponential_backoff,
        worker_id: str | None = None,
        wait_for_schema: bool = False,
        schedules: Sequence[Schedule[Any]] = (),
    ) -> None:
        self.client = client
        self.wait_for_schema = bool(wait_for_schema)
        self._steps: dict[str, Step[Any, Any]] = {}
        self._workflows: dict[str, Workflow[Any]] = {}
        for s in steps:
            self._add_step(s)
        given = dict(self._steps)  # the steps= themselves, apart from the workflows' steps
        for wf in workflows:
            if wf.name in self._workflows and self._workflows[wf.name] is not wf:
                raise InvalidInputError(f"two workflows named {wf.name!r}")
            self._workflows[wf.name] = wf
            for s in wf.steps():
                self._add_step(s)
        if not self._steps:
            raise InvalidInputError("a worker needs at least one step or workflow")
        # Each node's output type, per workflow: built once here, read by every handler run.
        self._output_types = {name: wf.output_types() for name, wf in self._workflows.items()}
        if queues is None:
            queues = {s.queue: DEFAULT_CONCURRENCY for s in self._steps.values()}
        self._queues = {
            name: _Queue(validate_queue(name), validate_int(n, what=f"{name!r} limit", low=1))
            for name, n in queues.items()
        }
        self._check_served(given)
        self.poll_interval = seconds(poll_interval, what="poll_interval")
        self.lease = seconds(lease, what="lease")
        self.heartbeat = seconds(heartbeat, what="heartbeat") if heartbeat else self.lease / 3
        self.shutdown_timeout = seconds(shutdown_timeout, what="shutdown_timeout")
        self.maintenance_interval = (
            seconds(maintenance_interval, what="maintenance_interval")
            if maintenance_interval is not None
            else max(self.poll_interval, min(self.lease / 2, 5.0))
        )
        self.claim_batch = validate_int(claim_batch, what="claim_batch", low=1)
        self.backoff = backoff
        self.id = worker_id or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self._kinds = sorted(self._steps)
        self._workflow_names = sorted(self._workflows)
        # Keyed by (task id, claims): a stale attempt and its task's next attempt can overlap.
        self._running: dict[tuple[int, int], _Running] = {}
        self._idle = asyncio.Event()
        self._idle.set()
        self._completer = Completer(client.pool, client.queries, client._publish)
        self._producers: list[asyncio.Task[None]] = []
        self._housekeeping: list[asyncio.Task[None]] = []
        self._stopping = asyncio.Event()
        self._hurry = asyncio.Event()
        self._started = False
        self._unsubscribe: Callable[[], None] | None = None
        # Schedules (cyclone/_scheduler.py): declared ones, dynamic ones of what this serves,
        # and the timer that also fires run deadlines and wait timeouts on time.
        self._scheduler = Scheduler(
            client, schedules, kinds=self._steps, workflows=self._workflows, worker_id=self.id
        )

    def _add_step(self, s: Step[Any, Any]) -> None:
        if not isinstance(s, Step):
            raise InvalidInputError(f"{s!r} is not a step with a handler")
        existing = self._steps.get(s.name)
        if existing is not None and existing is not s:
            raise InvalidInputError(f"two different steps are named {s.name!r}")
        self._steps[s.name] = s

    def _check_served(self, given: Mapping[str, Step[Any, Any]]) -> None:
        """Refuse what this worker could never claim; warn (once) about what it may not mean.

        A queue in ``queues=`` that no step uses is allowed: jobs enqueued with ``queue=``
        run there.
        """
        for step in given.values():
            if step.queue not in self._queues:
                raise InvalidInputError(
                    f"step {step.name!r} runs on queue {step.queue!r}, which queues= leaves "
                    f"out: add {_entries([step.queue])} to queues=, or leave queues= unset"
                )
        for wf in self._workflows.values():
            used_queues = {s.queue for s in wf.steps()}
            missing = sorted(used_queues - set(self._queues))
            if missing and len(missing) == len(used_queues):
                raise InvalidInputError(
                    f"workflow {wf.name!r} runs on {_names('queue', missing)}, which queues= "
                    f"leaves out: add {_entries(missing)} to queues=, or leave queues= unset"
                )
            if missing:
                _warn_once(
                    f"worker serves workflow {wf.name!r} but queues= leaves out its "
                    f"{_names('queue', missing)}: those nodes wait for another worker with "
                    f"workflows=[{wf.name}] that claims from them"
                )
        for wf in defined_workflows():
            if wf.name in self._workflows:
                continue
            used = sorted({n.kind.name for n in wf.nodes if n.kind is not None} & set(given))
            if used:
                _warn_once(
                    f"worker serves {_names('step', used)} but not workflow {wf.name!r}, "
                    f"which uses {'it' if len(used) == 1 else 'them'}: its nodes wait for "
                    f"a worker with workflows=[{wf.name}]"
                )

    def __repr__(self) -> str:
        return f"<cyclone.Worker {self.id} queues={sorted(self._queues)}>"

    # Lifecycle

    async def start(self) -> None:
        """Start claiming in the running event loop."""
        if self._started:
            raise RuntimeError("this worker was started already")
        await self.client._wait_until_ready(wait_for_schema=self.wait_for_schema)
        async with self.client._acquire() as conn:  # visible in stats once start() returns
            await self._present(conn)
        await self._scheduler.start()  # schedules: declare, then arm the timer
        self._started = True
        loop = asyncio.get_running_loop()
        self._completer.start()
        if self.client.notify:
            notifier = self.client._notifier
            self._unsubscribe = notifier.subscribe_queues(self._on_wakeup)
            notifier.acquire()
        self._producers = [
            loop.create_task(self._produce(queue), name=f"cyclone-{queue.name}")
            for queue in self._queues.values()
        ]
        self._housekeeping = [
            loop.create_task(self._heartbeat(), name="cyclone-heartbeat"),
            loop.create_task(self._maintain(), name="cyclone-maintenance"),
        ]
        logger.info(
            "worker %s started: queues %s; kinds %s; workflows %s",
            self.id,
            ", ".join(f"{q.name}={q.limit}" for q in self._queues.values()),
            ", ".join(self._kinds),
            ", ".join(self._workflow_names) or "none",
            extra={"worker": self.id, "queues": sorted(self._queues)},
        )

    async def stop(self, timeout: float | None = None) -> None:
        """Stop claiming, let running handlers finish (up to ``timeout``), then cancel them."""
        if not self._started or self._stopping.is_set():
            return
        self._stopping.set()
        for queue in self._queues.values():
            queue.wake.set()
        await asyncio.gather(*self._producers, return_exceptions=True)
        handlers = [r.task for r in self._running.values()]
        if handlers:
            # Until every handler is done, the deadline passes, or hurry() is called.
            finished: asyncio.Future[Any] = asyncio.gather(*handlers, return_exceptions=True)
            hurried: asyncio.Future[Any] = asyncio.ensure_future(self._hurry.wait())
            await asyncio.wait(
                [finished, hurried],
                timeout=self.shutdown_timeout if timeout is None else timeout,
                return_when=asyncio.FIRST_COMPLETED,
            )
            hurried.cancel()
            self.hurry()  # cancels the handlers still running; they give their tasks back
            await finished
        await self._scheduler.stop()  # schedules
        for task in self._housekeeping:
            task.cancel()
        await asyncio.gather(*self._housekeeping, return_exceptions=True)
        await self._completer.stop()
        if self._unsubscribe is not None:
            self._unsubscribe()
            await self.client._notifier.release()
        await self._leave()
        logger.info("worker %s stopped", self.id, extra={"worker": self.id})

    async def run(self) -> None:
        """Run until cancelled, then shut down gracefully."""
        await self.start()
        try:
            await self._stopping.wait()
        finally:
            await asyncio.shield(self.stop())

    def hurry(self) -> None:
        """Cancel the running handlers now, giving their tasks back (a second Ctrl-C)."""
        self._hurry.set()
        for running in list(self._running.values()):
            if running.reason is None and not running.finishing:
                running.reason = "shutdown"
                running.task.cancel()

    async def idle(self) -> None:
        """Wait until no handler of this worker is running (it may claim more afterwards)."""
        await self._idle.wait()

    async def drain(self) -> None:
        """Wait until none of this worker's kinds has work claimable now or running.

        Work scheduled for later (``process_in``, retry backoff) is not waited for.
        """
        while True:
            await self._idle.wait()
            async with self.client._acquire() as conn:
                if not await db.task_pending_work(
                    conn, self.client.queries, self._kinds, self._workflow_names
                ):
                    return
            for queue in self._queues.values():
                queue.wake.set()
            await asyncio.sleep(min(self.poll_interval, 0.05))  # let the producers claim it

    async def __aenter__(self) -> Worker:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    # Claiming

    def _on_wakeup(self, queue: str) -> None:
        if not queue:  # the listener reconnected: every queue polls now
            for q in self._queues.values():
                q.wake.set()
        elif queue in self._queues:
            self._queues[queue].wake.set()

    async def _produce(self, queue: _Queue) -> None:
        while not self._stopping.is_set():
            # Cleared before claiming: a wakeup that arrives during the claim is kept.
            queue.wake.clear()
            free = queue.limit - queue.running
            if free > 0:
                try:
                    await self._claim(queue, min(free, self.claim_batch))
                except db.DATABASE_ERRORS as exc:
                    queue.last_claim_full = False  # back off to the poll while it is down
                    queue.held = False
                    logger.warning(
                        "worker %s: claiming from queue %r failed: %s; trying again at the "
                        "next poll",
                        self.id,
                        queue.name,
                        exc,
                        extra={"worker": self.id, "queue": queue.name},
                    )
            if queue.last_claim_full and queue.running < queue.limit:
                continue  # more is waiting and there is room: claim again at once
            if queue.held and queue.retry_in == 0 and queue.running < queue.limit:
                continue  # flow control: the claim counted out of date; claim again
            timeout = self.poll_interval * random.uniform(0.8, 1.0)
            if queue.held and queue.retry_in:  # flow control: the next token is due then
                timeout = min(timeout, queue.retry_in)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout):  # no extra task, unlike wait_for
                    await queue.wake.wait()

    async def _claim(self, queue: _Queue, limit: int) -> None:
        started = time.perf_counter()
        async with self.client._borrow() as conn:  # its reset is not waited for
            rows = await db.task_claim(
                conn,
                self.client.queries,
                queue.name,
                self._kinds,
                limit,
                self.lease,
                self.id,
                self._workflow_names,
            )
            # Start the handlers before giving the connection back: the pool resets it on
            # release (a round trip), and the handlers need not wait for that.
            self._start_handlers(queue, rows)
        self.client.observers.claimed(queue.name, len(rows), time.perf_counter() - started)
        queue.last_claim_full = len(rows) == limit
        queue.held, queue.retry_in = rows.held, rows.retry_in  # flow control

    def _start_handlers(self, queue: _Queue, rows: list[db.Record]) -> None:
        loop = asyncio.get_running_loop()
        for row in rows:
            claimed = Claimed(
                id=row["id"],
                run_id=row["run_id"],
                node=row["node"],
                kind=row["kind"],
                queue=queue.name,
                attempt=row["attempt"],
                max_attempts=row["max_attempts"],
                claims=row["claims"],
                run_name=row["name"],
                input=row["input"],
                deps=row["deps"],
                trace=row["trace"],
                worker=self.id,
            )
            queue.running += 1
            task = loop.create_task(
                self._execute(queue, claimed), name=f"cyclone-task-{claimed.id}"
            )
            self._running[claimed.key] = _Running(claimed, task)
            self._idle.clear()

    # Executing

    async def _execute(self, queue: _Queue, claimed: Claimed) -> None:
        observers = self.client.observers
        started = time.perf_counter()
        outcome = "cancelled"
        try:
            with self._handler_span(claimed):
                outcome = await self._attempt(claimed)
        except asyncio.CancelledError:
            running = self._running.get(claimed.key)
            if running is None or running.reason is None:
                raise
        except Exception:
            logger.exception(
                "%s: writing its outcome failed; the lease will run out and the attempt is "
                "then reclaimed",
                claimed,
                extra=claimed.log_fields(),
            )
        finally:
            observers.finished(claimed.kind, claimed.queue, outcome, time.perf_counter() - started)
            self._running.pop(claimed.key, None)
            if not self._running:
                self._idle.set()
            queue.running -= 1
            if queue.last_claim_full or queue.held or self._stopping.is_set():
                queue.wake.set()  # held by a limit: a slot this worker held is free now

    def _handler_span(self, claimed: Claimed) -> contextlib.AbstractContextManager[None]:
        observers = self.client.observers
        if not observers.members:  # the common case: no span, nothing to build for one
            return contextlib.nullcontext()
        carrier = None if claimed.trace is None else _codec.decode(claimed.trace, dict[str, str])
        return observers.handler_span(f"run {claimed.kind}", carrier, claimed.span_attributes())

    async def _attempt(self, claimed: Claimed) -> str:
        """Run one attempt and write its outcome; return the outcome's name."""
        step = self._steps[claimed.kind]
        completion = CompletionTx(self.client.pool)
        log = claimed.log_fields()
        try:
            ctx, value = self._prepare(claimed, step, completion)
            ctx._bind()
            try:
                if step.timeout is None:
                    result = await step.handler(ctx, value)
                else:
                    async with asyncio.timeout(step.timeout):
                        result = await step.handler(ctx, value)
            finally:
                ctx._close()
                self._finishing(claimed)
            output = _codec.encode(
                result,
                step.output_type,
                what=f"output of {step.name!r}",
                limit=self.client.output_limit,
            )
        except Snooze as snooze:
            await completion.rollback()
            logger.info("%s snoozed for %.3g s", claimed, snooze.delay, extra=log)
            await self._completer.retry(claimed, delay=snooze.delay, error=None, refund=True)
            return "snoozed"
        except asyncio.CancelledError:
            await asyncio.shield(completion.rollback())
            running = self._running.get(claimed.key)
            reason = running.reason if running else None
            if reason == "shutdown":
                # Give the attempt back so another worker can take it without waiting.
                await asyncio.shield(
                    self._completer.retry(claimed, delay=0, error=None, refund=True)
                )
            if reason == "shutdown":
                logger.info(
                    "%s interrupted by shutdown; handed back to its queue", claimed, extra=log
                )
            elif reason is None:
                logger.info("%s cancelled", claimed, extra=log)
            raise
        except Exception as exc:
            await completion.rollback()
            timeout = isinstance(exc, TimeoutError) and step.timeout is not None
            return await self._failed(claimed, exc, log, kind="Timeout" if timeout else None)
        if completion.opened:
            accepted = await self._completer.complete_in(completion, claimed, output)
        else:
            accepted = await self._completer.complete(claimed, output)
        if accepted:
            logger.debug("%s completed", claimed, extra=log)
            return "completed"
        logger.warning(
            "%s returned; completion rejected and rolled back: the attempt no longer "
            "owns its task (the run was cancelled, or the lease expired and another "
            "worker took the task over)",
            claimed,
            extra=log,
        )
        return "rejected"

    def _finishing(self, claimed: Claimed) -> None:
        # The handler is over; what is left is writing its outcome, which the heartbeat and
        # hurry() must not cancel (the write itself may delete the task).
        running = self._running.get(claimed.key)
        if running is not None:
            running.finishing = True

    def _prepare(
        self, claimed: Claimed, step: Step[Any, Any], completion: CompletionTx
    ) -> tuple[Context, Any]:
        outputs: dict[str, Any] = {}
        if claimed.deps is not None:
            outputs = _codec.decode(claimed.deps, dict[str, msgspec.Raw])
        workflow = self._workflows.get(claimed.run_name) if claimed.node is not None else None
        node = workflow.get_node(claimed.node) if workflow and claimed.node else None
        output_types = self._output_types[workflow.name] if workflow else None
        ctx = Context(
            client=self.client,
            run_id=claimed.run_id,
            node=claimed.node,
            kind=claimed.kind,
            attempt=claimed.attempt,
            max_attempts=claimed.max_attempts,
            queue=claimed.queue,
            outputs=outputs,
            output_types=output_types,
            completion=completion,
        )
        if node is not None and node.input_fn is not None:
            assert workflow is not None and output_types is not None
            wf_input = _codec.decode(claimed.input, workflow.input_type)
            decoded = {
                name: _codec.decode(bytes(raw), output_types.get(name, Any))
                for name, raw in outputs.items()
            }
            return ctx, node.input_fn(wf_input, decoded)
        return ctx, _codec.decode(claimed.input, step.input_type)

    async def _failed(
        self, claimed: Claimed, exc: BaseException, log: dict[str, Any], *, kind: str | None
    ) -> str:
        error = error_record(claimed, exc, kind=kind)
        what = (
            f"timed out after {self._steps[claimed.kind].timeout:g} s"
            if kind
            else (f"failed: {type(exc).__name__}: {exc}")
        )
        if claimed.attempt < claimed.max_attempts:
            delay = self.backoff(claimed.attempt)
            logger.warning("%s %s; retrying in %.2f s", claimed, what, delay, extra=log)
            await self._completer.retry(claimed, delay=delay, error=error, refund=False)
            return "retried"
        logger.error(
            "%s %s; no attempts left, so the run fails", claimed, what, exc_info=exc, extra=log
        )
        await self._completer.fail(claimed, error)
        return "failed"

    # Leases

    async def _heartbeat(self) -> None:
        while True:
            await asyncio.sleep(self.heartbeat)
            try:
                await self._beat()
            except db.DATABASE_ERRORS as exc:
                logger.warning(
                    "worker %s: heartbeat failed: %s; trying again in %.3g s",
                    self.id,
                    exc,
                    self.heartbeat,
                    extra={"worker": self.id},
                )

    async def _beat(self) -> None:
        """Record this worker as live, renew its leases, and stop handlers that lost theirs."""
        running = list(self._running.values())
        async with self.client._acquire() as conn:
            await self._present(conn)
            if not running:
                return
            owned = await db.task_heartbeat(
                conn,
                self.client.queries,
                [r.claimed.run_id for r in running],
                [r.claimed.id for r in running],
                [r.claimed.claims for r in running],
                self.lease,
            )
        lost = []
        for r in running:
            if r.finishing:
                continue  # its completion may have deleted the task just now
            if r.claimed.key not in owned and self._running.get(r.claimed.key) is r:
                # Cancelled run, reclaimed lease or expired deadline: stop the handler.
                r.reason = "lost"
                r.task.cancel()
                lost.append(r.claimed)
        for claimed in lost:  # rare: worth a read to say why
            async with self.client._acquire() as conn:
                state = await db.run_status(conn, self.client.queries, claimed.run_id)
            _log_lost(claimed, state)

    async def _present(self, conn: db.Conn) -> None:
        """Record this worker as live for a few more heartbeats, with what it claims."""
        await db.worker_present(
            conn,
            self.client.queries,
            self.id,
            socket.gethostname(),
            os.getpid(),
            sorted(self._queues),
            self._kinds,
            self._workflow_names,
            self.heartbeat * PRESENCE_BEATS,
        )

    async def _leave(self) -> None:
        """Remove this worker's presence row (it would expire by itself anyway)."""
        try:
            async with self.client._acquire() as conn:
                await db.worker_leave(conn, self.client.queries, self.id)
        except (*db.DATABASE_ERRORS, InvalidStateError) as exc:
            logger.warning(
                "worker %s: removing its presence row failed: %s; it expires in %.3g s",
                self.id,
                exc,
                self.heartbeat * PRESENCE_BEATS,
                extra={"worker": self.id},
            )

    # Maintenance

    async def _maintain(self) -> None:
        while True:
            await asyncio.sleep(self.maintenance_interval * random.uniform(0.8, 1.0))
            try:
                await self.maintain_once()
            except db.DATABASE_ERRORS as exc:
                logger.warning(
                    "worker %s: maintenance pass failed: %s; trying again in %.3g s",
                    self.id,
                    exc,
                    self.maintenance_interval,
                    extra={"worker": self.id},
                )

    async def maintain_once(self, limit: int = 100) -> None:
        """One maintenance pass: reclaim expired leases, fail overdue runs and wait nodes, and
        (with a client ``retention``) delete terminal runs old enough."""
        await maintenance.run_once(self.client, worker_id=self.id, limit=limit)


def _names(word: str, names: Sequence[str]) -> str:
    """``queue 'mail'``, or ``queues 'mail', 'bulk'``."""
    return f"{word}{'s' if len(names) > 1 else ''} {', '.join(repr(n) for n in names)}"


def _entries(queues: Sequence[str]) -> str:
    """``"mail": N, "bulk": N``: what to add to ``queues=``."""
    return ", ".join(f'"{q}": N' for q in queues)


def _warn_once(message: str) -> None:
    if message not in _WARNED:
        _WARNED.add(message)
        logger.warning(message)


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
