"""Prometheus metrics for Cyclone (``pip install 'cyclone-pg[prometheus]'``).

    from cyclone.prometheus import PrometheusMetrics
    client.observe(PrometheusMetrics())     # registers on prometheus_client's default registry

Counters: ``cyclone_enqueued_total{kind,queue}``, ``cyclone_claimed_total{queue}``,
``cyclone_completed_total``, ``cyclone_failed_total`` (last attempt), ``cyclone_retried_total``,
``cyclone_snoozed_total``, ``cyclone_interrupted_total{reason}`` (cancelled, or a completion
rejected after its task was reclaimed), ``cyclone_reclaimed_total``. Histograms:
``cyclone_claim_seconds{queue}``, ``cyclone_handler_seconds{kind,queue}``. Gauge:
``cyclone_queue_depth{queue,state}`` (available, scheduled, running), refreshed by each
worker's maintenance pass. Schedules: ``cyclone_schedule_fired_total{schedule}`` (slots whose
run a worker made) and the histogram ``cyclone_schedule_lag_seconds{schedule}`` (slot time to
the run's insert, by the database's clock).
"""

from __future__ import annotations

from typing import TypeVar

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram

from cyclone._observe import Observer
from cyclone._run import QueueStats

__all__ = ["PrometheusMetrics"]

_OUTCOMES = ("completed", "failed", "retried", "snoozed")
_M = TypeVar("_M", Counter, Gauge, Histogram)


class PrometheusMetrics(Observer):
    """An observer that keeps Prometheus counters, histograms and a queue-depth gauge."""

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
        self.claim_seconds = metric(
            Histogram, "claim_seconds", "Time a claim statement took.", ["queue"]
        )
        self.handler_seconds = metric(
            Histogram,
            "handler_seconds",
            "Time an attempt took, handler and outcome write.",
            ["kind", "queue"],
        )
        self.queue_depth = metric(
            Gauge, "queue_depth", "Live tasks per queue and state.", ["queue", "state"]
        )
        self._queues_seen: set[str] = set()
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

    def queue_stats(self, stats: list[QueueStats]) -> None:
        rows = {row.queue: row for row in stats}
        # A queue left out of the snapshot has no live tasks: its gauges go to 0.
        self._queues_seen.update(rows)
        for queue in self._queues_seen:
            row = rows.get(queue)
            for state in ("available", "scheduled", "running"):
                depth = getattr(row, state) if row is not None else 0
                self.queue_depth.labels(queue=queue, state=state).set(depth)

    def schedule_fired(self, schedule: str, lag: float) -> None:
        self.schedule_fired_total.labels(schedule=schedule).inc()
        self.schedule_lag.labels(schedule=schedule).observe(lag)
