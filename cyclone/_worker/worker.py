"""The worker: wires the pipeline that claims tasks, runs handlers and writes outcomes, and
runs its lifecycle (start, stop, run, hurry, idle, drain).

::

    NOTIFY / poll / freed slot ─> Producer (one per queue: producer.py) claims tasks
                                    └─> Attempts (attempt.py): each attempt in its slot
                                        (slots.py), its lease held until its outcome is written
                                          ├─> Executor (executor.py) runs its handler
                                          │     └─> an outcome value (outcomes.py)
                                          └─> Completer (completer.py) writes it in a
                                                batch, by the outcome writes (writes.py)
    LeaseKeeper (leases.py): heartbeat, presence, cancels handlers whose task is gone
    maintenance (maintenance.py): reclaims expired leases, fails what is overdue
    stop (shutdown.py): lets running handlers finish, then cancels them
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import random
import socket
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Generic

from cyclone._model.errors import InvalidInputError, LifecycleError
from cyclone._model.options import seconds, validate_int, validate_queue
from cyclone._model.steps import Step
from cyclone._services.loops import every
from cyclone._services.resource import AsyncResource
from cyclone._storage import queries as db
from cyclone._worker import maintenance
from cyclone._worker.ahead import most_ahead
from cyclone._worker.attempt import Attempts
from cyclone._worker.batches import Batches
from cyclone._worker.completer import Completer
from cyclone._worker.executor import Executor
from cyclone._worker.leases import LeaseKeeper
from cyclone._worker.outcomes import Claiming
from cyclone._worker.ports import ClientT, insert_parts
from cyclone._worker.presence import DEFAULT_GRACE, PROBE_INTERVAL, Presence
from cyclone._worker.producer import Producer
from cyclone._worker.scheduler import Scheduler
from cyclone._worker.served import check_served, gather
from cyclone._worker.shutdown import finish_handlers
from cyclone._worker.spawn import ChildSpawner

if TYPE_CHECKING:
    from cyclone._model.schedules import Schedule
    from cyclone._model.workflows import Workflow

logger = logging.getLogger("cyclone")

DEFAULT_CONCURRENCY = 10
# Outcomes that may wait unwritten, per slot of every queue (and per task a queue may claim
# ahead), before claims hold back.
UNWRITTEN_PER_SLOT = 2


def exponential_backoff(attempt: int, *, base: float = 1.0, cap: float = 3600.0) -> float:
    """Seconds before retrying after failed attempt ``attempt``: doubling, capped, jittered."""
    delay: float = min(cap, base * 2 ** (attempt - 1))
    return delay * random.uniform(0.5, 1.0)


class Worker(AsyncResource, Generic[ClientT]):
    """Runs the handlers of ``steps`` and of every step in ``workflows`` (and in the
    workflows their child nodes submit runs of).

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
    ``claim_ahead`` lets a queue whose handlers are short claim tasks beyond its free slots,
    each waiting in this process for a slot (docs/worker.md, "Claiming ahead"); turn it off
    to claim only for free slots: several processes then share a queue's backlog more
    evenly, and a task of higher priority enqueued later never waits behind tasks held here.
    ``liveness_grace`` is how long this worker's liveness lock may stay free (its session
    with the database cut) before its peers take it for dead and release its running tasks;
    a peer on the same machine that finds its process gone does so at once (docs/operations.md,
    "When a worker dies"). ``threads`` caps the threads running plain ``def`` handlers
    (default: one per slot of the queues; docs/sync-handlers.md).
    """

    def __init__(
        self,
        client: ClientT,
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
        claim_ahead: bool = True,
        backoff: Callable[[int], float] = exponential_backoff,
        worker_id: str | None = None,
        wait_for_schema: bool = False,
        schedules: Sequence[Schedule[Any]] = (),
        liveness_grace: float = DEFAULT_GRACE,
        threads: int | None = None,
    ) -> None:
        self.client: ClientT = client
        """The client it was given (a :class:`cyclone.Client`)."""
        services = self._services = client.services
        self.wait_for_schema = bool(wait_for_schema)
        given, self._steps, self._workflows = gather(steps, workflows)
        if queues is None:
            queues = {s.queue: DEFAULT_CONCURRENCY for s in self._steps.values()}
        self._queues = {  # queue name to its limit
            validate_queue(name): validate_int(n, what=f"{name!r} limit", low=1)
            for name, n in queues.items()
        }
        check_served(given, self._queues, self._workflows)
        self.poll_interval = seconds(poll_interval, what="poll_interval")
        self.lease = seconds(lease, what="lease")
        if not 0 < self.lease < math.inf:  # 0: every claim lost at once, its heartbeat spinning
            raise InvalidInputError(f"lease must be a number of seconds above 0, not {lease!r}")
        self.heartbeat = seconds(heartbeat, what="heartbeat") if heartbeat else self.lease / 3
        self.liveness_grace = seconds(liveness_grace, what="liveness_grace")
        if not 0 < self.liveness_grace < math.inf:
            raise InvalidInputError(
                f"liveness_grace must be a number of seconds above 0, not {liveness_grace!r}"
            )
        self.shutdown_timeout = seconds(shutdown_timeout, what="shutdown_timeout")
        self.maintenance_interval = (
            seconds(maintenance_interval, what="maintenance_interval")
            if maintenance_interval is not None
            else max(self.poll_interval, min(self.lease / 2, 5.0))
        )
        self.claim_batch = validate_int(claim_batch, what="claim_batch", low=1, high=db.CLAIM_MAX)
        if not isinstance(claim_ahead, bool):
            raise InvalidInputError(f"claim_ahead must be True or False, not {claim_ahead!r}")
        self.claim_ahead = claim_ahead
        self.backoff = backoff
        self.id = worker_id or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self._kinds = sorted(self._steps)
        self._workflow_names = sorted(self._workflows)
        retentions = maintenance.retentions(client.retention, self._steps, self._workflows)
        self._retaining = maintenance.Retaining(retentions)
        self._presence = Presence(
            services,
            self.id,
            (sorted(self._queues), self._kinds, self._workflow_names),
            heartbeat=self.heartbeat,
            grace=self.liveness_grace,
            rescue=lambda dead: maintenance.rescue(services, worker_id=self.id, dead=dead),
            on_rescued_alive=lambda: services.observers.rescued_alive(self.id),
        )
        self._leases = LeaseKeeper(
            services.database,
            worker_id=self.id,
            lease=self.lease,
            interval=self.heartbeat,
            present=self._presence.present,
        )
        parts = insert_parts(client)  # for scheduled runs and child runs
        self._completer = Completer(
            services.database,
            services.publisher,
            bound=sum(
                UNWRITTEN_PER_SLOT * (n + (most_ahead(n) if claim_ahead else 0))
                for n in self._queues.values()
            ),
            on_written=self._room_made,
            spawn=ChildSpawner(parts, self._steps) or None,
            discard=retentions.discarding(self._steps),
        )
        executor = Executor(
            self._steps,
            self._workflows,
            database=services.database,
            backoff=backoff,
            leases=self._leases,
            output_limit=client.output_limit,
            cipher=client.cipher,
            observers=services.observers,
            new_context=services.new_context,
            threads=sum(self._queues.values()) if threads is None else threads,
        )
        claiming = Claiming(
            self.id,
            self._kinds,
            self._workflow_names,
            self.lease,
            self.claim_batch,
            self.poll_interval,
            claim_ahead,
        )
        batches = Batches.serving(executor, self._completer, services.new_batch_context)
        attempts = Attempts(executor, self._completer, self._leases, batches)
        self._producers = {
            name: Producer(
                services.database,
                services.observers,
                name,
                limit,
                claiming,
                attempts=attempts,
                completer=self._completer,
            )
            for name, limit in self._queues.items()
        }
        self._tasks: list[asyncio.Task[None]] = []  # the producers'
        self._housekeeping: list[asyncio.Task[None]] = []
        self._stopping = asyncio.Event()
        self._hurry = asyncio.Event()
        self._started = False
        self._unsubscribe: Callable[[], None] | None = None
        # Schedules (cyclone/_worker/scheduler.py): declared ones, dynamic ones of what this serves,
        # and the timer that also fires run deadlines and wait timeouts on time.
        self._scheduler = Scheduler(
            services,
            parts,
            schedules,
            kinds=self._steps,
            workflows=self._workflows,
            worker_id=self.id,
        )

    def __repr__(self) -> str:
        return f"<cyclone.Worker {self.id} queues={sorted(self._queues)}>"

    # Lifecycle

    async def start(self) -> None:
        """Start claiming in the running event loop."""
        if self._started:
            raise LifecycleError("this worker was started already")
        database = self._services.database
        await database.wait_until_ready(wait_for_schema=self.wait_for_schema)
        await self._presence.start()  # visible in stats once start() returns
        await self._scheduler.start()  # schedules: declare, then arm the timer
        self._started = True
        loop = asyncio.get_running_loop()
        self._completer.start()
        notifier = self._services.notifier
        if notifier is not None:
            self._unsubscribe = notifier.subscribe_queues(self._on_wakeup)
            notifier.acquire()
        self._tasks = [
            loop.create_task(p.run(), name=f"cyclone-{name}") for name, p in self._producers.items()
        ]
        self._housekeeping = [
            loop.create_task(self._leases.run(), name="cyclone-heartbeat"),
            loop.create_task(self._maintain(), name="cyclone-maintenance"),
            loop.create_task(self._probe(), name="cyclone-rescue-probe"),
        ]
        layout = database.layout
        logger.info(
            "worker %s started: queues %s; kinds %s; workflows %s%s",
            self.id,
            ", ".join(f"{name}={limit}" for name, limit in self._queues.items()),
            ", ".join(self._kinds),
            ", ".join(self._workflow_names) or "none",
            f"; on {layout.description}" if layout.citus else "",
            extra={"worker": self.id, "queues": sorted(self._queues)},
        )

    async def stop(self, timeout: float | None = None) -> None:
        """Stop claiming, let running handlers finish (up to ``timeout``), then cancel them."""
        if not self._started or self._stopping.is_set():
            return
        self._stopping.set()
        for producer in self._producers.values():
            producer.stop()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        deadline = self.shutdown_timeout if timeout is None else timeout
        await finish_handlers(
            self._leases,
            self._completer,
            deadline=deadline,
            hurried=self._hurry,
            hurry=self.hurry,
            worker_id=self.id,
        )
        await self._scheduler.stop()  # schedules
        for task in self._housekeeping:
            task.cancel()
        await asyncio.gather(*self._housekeeping, return_exceptions=True)
        await self._completer.stop()
        await self._services.publisher.settle(deadline)  # its last run ends, their connection
        if self._unsubscribe is not None and self._services.notifier is not None:
            self._unsubscribe()
            await self._services.notifier.release()
        await self._presence.leave()
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
        self._leases.hurry()

    async def idle(self) -> None:
        """Wait until no handler of this worker is running and every outcome is written (it
        may claim more afterwards)."""
        await self._leases.idle.wait()

    async def drain(self) -> None:
        """Wait until none of this worker's kinds has work claimable now or running.

        Work scheduled for later (``process_in``, retry backoff) is not waited for.
        """
        while True:
            await self._leases.idle.wait()
            async with self._services.database.acquire() as conn:
                if not await db.task_pending_work(
                    conn, self._services.database.queries, self._kinds, self._workflow_names
                ):
                    return
            for producer in self._producers.values():
                producer.wake()
            await asyncio.sleep(min(self.poll_interval, 0.05))  # let the producers claim it

    async def _begin(self) -> None:
        await self.start()

    async def _end(self, failed: bool) -> None:
        # Shielded: a cancelled ``async with`` still stops everything it started (a second
        # stop() returns at once, so nothing else would).
        await asyncio.shield(self.stop())

    def _on_wakeup(self, queue: str) -> None:
        if not queue:  # the listener reconnected: every queue polls now
            for producer in self._producers.values():
                producer.wake()
        elif queue in self._producers:
            self._producers[queue].wake()

    def _room_made(self) -> None:
        for producer in self._producers.values():
            producer.room_made()

    # Maintenance

    async def _maintain(self) -> None:
        await every(
            self.maintenance_interval,
            self.maintain_once,
            jitter=True,
            what="maintenance pass",
            worker_id=self.id,
        )

    async def _probe(self) -> None:
        if self._presence.key is not None:  # without a listener, no peer holds a lock either
            # A first look at once: a worker started after its peers died rescues them now.
            await every(
                PROBE_INTERVAL, self._rescue, first=0.0, what="rescue probe", worker_id=self.id
            )

    async def _rescue(self) -> float:
        """Look for lost peers and release their tasks; look again in a second, or as soon
        as a peer's grace ends."""
        lookout = await self._presence.look()
        if lookout.release:
            await maintenance.rescue(self._services, worker_id=self.id, dead=lookout.dead)
        return lookout.again

    async def maintain_once(self, limit: int = 100) -> None:
        """One maintenance pass: reclaim expired leases, fail overdue runs and wait nodes, end
        expired jobs, and delete terminal runs old enough (by ``retention``s)."""
        await maintenance.run_once(self._services, self._retaining, worker_id=self.id, limit=limit)
