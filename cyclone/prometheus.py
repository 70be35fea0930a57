"""Prometheus metrics for Cyclone (``pip install 'cyclone-pg[prometheus]'``).

Two parts, because they count different things:

- :class:`PrometheusMetrics`, an observer of one process: what *this process* did. Install it
  in every process; a sum across processes is the total.
- :class:`QueueCollector`: what is in *the database*, read when Prometheus scrapes. Every
  process would report the same figures, so run it in exactly one place per database (one
  worker started with ``--queue-metrics``, or a small exporter process).

::

    from cyclone.prometheus import PrometheusMetrics, QueueCollector, serve_metrics
    client.observe(PrometheusMetrics())     # registers on prometheus_client's default registry
    QueueCollector(client)                  # in one process only; create it in the event loop
    serve_metrics(client, 9100)             # or both at once, on 127.0.0.1:9100/metrics

Per process (:class:`PrometheusMetrics`), counters: ``cyclone_enqueued_total{kind,queue}``
(``kind`` is the workflow's name for a submit), ``cyclone_claimed_total{queue}``;
``cyclone_completed_total``, ``cyclone_retried_total``, ``cyclone_snoozed_total`` and
``cyclone_failed_total`` (last attempt), each ``{kind,queue}``;
``cyclone_interrupted_total{reason}`` (``cancelled``, or ``rejected``: a completion refused
after its task was taken over); ``cyclone_reclaimed_total`` (tasks this process's maintenance
released), ``cyclone_released_total{reason}`` (the same by reason: ``worker_lost`` or
``lease_expired``) and ``cyclone_rescued_alive_total`` (times peers released the tasks of a
worker of this process that was alive: cut off from the database past its grace).
Histograms: ``cyclone_claim_seconds{queue}``, ``cyclone_handler_seconds{kind,queue}``.

Per database (:class:`QueueCollector`), gauges: ``cyclone_queue_depth{queue,state}``
(``available``, ``scheduled``, ``running``, ``blocking``), ``cyclone_queue_expired{queue}``
(running, lease run out), ``cyclone_queue_oldest_available_seconds{queue}``,
``cyclone_queue_unserved{queue,kind,workflow}`` (claimable, and no live worker serves it;
``workflow`` is empty for jobs), ``cyclone_queue_workers{queue}`` (live workers claiming from
it) and ``cyclone_queue_stats_up`` (1 when the last scrape could read the database).

Schedules (per process): ``cyclone_schedule_fired_total{schedule}`` (slots whose run this
process made) and the histogram ``cyclone_schedule_lag_seconds{schedule}`` (slot time to the
run's insert, by the database's clock).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from typing import TYPE_CHECKING, TypeVar
from wsgiref.simple_server import WSGIServer

from prometheus_client import (
    REGISTRY,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    start_http_server,
)
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from cyclone._model.errors import InvalidStateError
from cyclone._model.stats import QueueStats
from cyclone._services.observe import Observer
from cyclone._storage import queries as db

if TYPE_CHECKING:
    from cyclone._client import Client

__all__ = ["PrometheusMetrics", "QueueCollector", "serve_metrics"]

logger = logging.getLogger("cyclone")

_OUTCOMES = ("completed", "failed", "retried", "snoozed")
_STATES = ("available", "scheduled", "running", "blocking")
_M = TypeVar("_M", Counter, Gauge, Histogram)


class PrometheusMetrics(Observer):
    """An observer that counts what this process enqueued, claimed and ran."""

    def __init__(self, registry: CollectorRegistry = REGISTRY, namespace: str = "cyclone") -> None:
        def metric(kind: type[_M], name: str, doc: str, labels: list[str]) -> _M:
            return kind(name, doc, labels, namespace=namespace, registry=registry)

        self.enqueued_runs = metric(
            Counter, "enqueued", "Runs written by enqueue and submit.", ["kind", "queue"]
        )
        self.claimed_total = metric(Counter, "claimed", "Tasks claimed by workers.", ["queue"])
        self.outcomes = {
            outcome: metric(Counter, outcome, f"Attempts that ended {outcome}.", ["kind", "queue"])
            for outcome in _OUTCOMES
        }
        self.interrupted = metric(
            Counter,
            "interrupted",
            "Attempts cancelled, or whose completion was rejected.",
            ["reason"],
        )
        self.reclaimed_total = metric(
            Counter, "reclaimed", "Tasks reclaimed after their lease.", []
        )
        self.released_total = metric(
            Counter, "released", "Running tasks of other workers released, by reason.", ["reason"]
        )
        self.rescued_alive_total = metric(
            Counter,
            "rescued_alive",
            "Releases of a live worker's tasks by its peers (cut off past its grace).",
            [],
        )
        self.claim_seconds = metric(
            Histogram, "claim_seconds", "Time a claim statement took.", ["queue"]
        )
        self.handler_seconds = metric(
            Histogram,
            "handler_seconds",
            "Time an attempt took, handler and outcome write.",
            ["kind", "queue"],
        )
        self.schedule_fired_total = metric(
            Counter, "schedule_fired", "Schedule slots whose run was made.", ["schedule"]
        )
        self.schedule_lag = metric(
            Histogram,
            "schedule_lag_seconds",
            "Time from a schedule's slot to the insert of its run.",
            ["schedule"],
        )

    def enqueued(self, kind: str, queue: str, count: int) -> None:
        self.enqueued_runs.labels(kind=kind, queue=queue).inc(count)

    def claimed(self, queue: str, count: int, seconds: float) -> None:
        self.claim_seconds.labels(queue=queue).observe(seconds)
        if count:
            self.claimed_total.labels(queue=queue).inc(count)

    def finished(self, kind: str, queue: str, outcome: str, seconds: float) -> None:
        self.handler_seconds.labels(kind=kind, queue=queue).observe(seconds)
        if outcome in self.outcomes:
            self.outcomes[outcome].labels(kind=kind, queue=queue).inc()
        else:
            self.interrupted.labels(reason=outcome).inc()

    def reclaimed(self, count: int) -> None:
        self.reclaimed_total.inc(count)

    def released(self, reason: str, count: int) -> None:
        self.released_total.labels(reason=reason).inc(count)

    def rescued_alive(self, worker: str) -> None:
        self.rescued_alive_total.inc()

    def schedule_fired(self, schedule: str, lag: float) -> None:
        self.schedule_fired_total.labels(schedule=schedule).inc()
        self.schedule_lag.labels(schedule=schedule).observe(lag)


class QueueCollector(Collector):
    """Database-wide gauges, read with ``client.stats()`` each time Prometheus scrapes.

    Create it in the client's event loop (or pass ``loop``); scrapes must come from another
    thread, as with ``prometheus_client.start_http_server``, since each one waits up to
    ``timeout`` seconds for the read to run on that loop. Registers on ``registry`` unless
    it is ``None``.
    """

    def __init__(
        self,
        client: Client,
        *,
        registry: CollectorRegistry | None = REGISTRY,
        namespace: str = "cyclone",
        timeout: float = 10.0,
        loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        self.client = client
        self.timeout = timeout
        self._loop = loop or asyncio.get_running_loop()
        self._ns = namespace
        if registry is not None:
            registry.register(self)

    def describe(self) -> Iterator[Metric]:
        """The gauges, without reading the database (``registry.register`` calls this)."""
        yield from self._families()

    def collect(self) -> Iterator[Metric]:
        """Read the database and yield the gauges; on failure only ``..._stats_up`` (0)."""
        depth, expired, oldest, unserved, workers, paused, limit, up = self._families()
        try:
            stats = self._read()
        except (*db.DATABASE_ERRORS, InvalidStateError, TimeoutError) as exc:
            logger.warning(
                "reading queue stats for Prometheus failed: %s; %s_queue_stats_up is 0",
                exc,
                self._ns,
            )
            up.add_metric([], 0)
            yield up
            return
        for row in stats:
            for state in _STATES:
                depth.add_metric([row.queue, state], getattr(row, state))
            expired.add_metric([row.queue], row.expired)
            oldest.add_metric([row.queue], row.oldest_seconds or 0.0)
            workers.add_metric([row.queue], row.workers)
            for work in row.unserved_work:
                unserved.add_metric([row.queue, work.kind, work.workflow or ""], work.count)
            paused.add_metric([row.queue], int(row.paused))  # flow control
            for name, value in [
                ("concurrency", row.concurrency_limit),
                ("rate_per_second", row.rate_limit and row.rate_limit[0] / row.rate_limit[1]),
                ("key_concurrency", row.key_concurrency_limit),
                (
                    "key_rate_per_second",
                    row.key_rate_limit and row.key_rate_limit[0] / row.key_rate_limit[1],
                ),
            ]:
                if value is not None:
                    limit.add_metric([row.queue, name], value)
        up.add_metric([], 1)
        yield from (depth, expired, oldest, unserved, workers, paused, limit, up)

    def _read(self) -> list[QueueStats]:
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is self._loop:
            raise InvalidStateError(
                "QueueCollector was scraped from its client's event loop, where it cannot "
                "wait for the database: serve metrics from a thread (serve_metrics, or "
                "prometheus_client.start_http_server)"
            )
        future = asyncio.run_coroutine_threadsafe(self.client.stats(), self._loop)
        try:
            return future.result(self.timeout)
        except TimeoutError:
            future.cancel()
            raise

    def _families(self) -> tuple[GaugeMetricFamily, ...]:
        ns = self._ns

        def gauge(name: str, doc: str, labels: list[str]) -> GaugeMetricFamily:
            return GaugeMetricFamily(f"{ns}_{name}", doc, labels=labels)

        return (
            gauge("queue_depth", "Live tasks per queue and state.", ["queue", "state"]),
            gauge("queue_expired", "Running tasks whose lease ran out.", ["queue"]),
            gauge(
                "queue_oldest_available_seconds",
                "How long the oldest claimable task has waited (0: none).",
                ["queue"],
            ),
            gauge(
                "queue_unserved",
                "Claimable tasks that no live worker serves.",
                ["queue", "kind", "workflow"],
            ),
            gauge("queue_workers", "Live workers claiming from the queue.", ["queue"]),
            gauge("queue_paused", "1 while the queue is paused.", ["queue"]),
            gauge(
                "queue_limit",
                "The queue's flow-control limits (concurrency, rate_per_second, "
                "key_concurrency, key_rate_per_second); none for no limit.",
                ["queue", "limit"],
            ),
            gauge("queue_stats_up", "1 when the last scrape read the database.", []),
        )


def serve_metrics(
    client: Client,
    port: int,
    *,
    host: str = "127.0.0.1",
    queue_metrics: bool = False,
    registry: CollectorRegistry = REGISTRY,
) -> WSGIServer:
    """Serve ``/metrics`` on ``host:port`` from a thread: this process's counters and, with
    ``queue_metrics`` (in one process per database), the :class:`QueueCollector` gauges.

    Call it in the client's event loop. Port 0 picks a free port (``server.server_port``);
    ``server.shutdown()`` stops it.
    """
    client.observe(PrometheusMetrics(registry))
    if queue_metrics:
        QueueCollector(client, registry=registry)
    server, _thread = start_http_server(port, addr=host, registry=registry)
    return server
