"""Prometheus metrics for Cyclone (``pip install 'cyclone[prometheus]'``).

    from cyclone.prometheus import PrometheusMetrics
    client.observe(PrometheusMetrics())     # registers on prometheus_client's default registry

Counters: ``cyclone_enqueued_total{kind,queue}``, ``cyclone_claimed_total{queue}``,
``cyclone_completed_total``, ``cyclone_failed_total`` (last attempt), ``cyclone_retried_total``,
``cyclone_snoozed_total``, ``cyclone_interrupted_total{reason}`` (cancelled, or a completion
rejected after its task was reclaimed), ``cyclone_reclaimed_total``. Histograms:
``cyclone_claim_seconds{queue}``, ``cyclone_handler_seconds{kind,queue}``. Gauge:
``cyclone_queue_depth{queue,state}`` (available, scheduled, running), refreshed by each
worker's maintenance pass.
"""

from __future__ import annotations

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram

from cyclone._observe import Observer
from cyclone._run import QueueStats

__all__ = ["PrometheusMetrics"]

_OUTCOMES = {"completed", "failed", "retried", "snoozed"}


class PrometheusMetrics(Observer):
    """An observer that keeps Prometheus counters, histograms and a queue-depth gauge."""

    def __init__(self, registry: CollectorRegistry = REGISTRY, namespace: str = "cyclone") -> None:
        def counter(name: str, doc: str, labels: list[str]) -> Counter:
            return Counter(name, doc, labels, namespace=namespace, registry=registry)

        self.enqueued_runs = counter(
            "enqueued", "Runs written by enqueue and submit.", ["kind", "queue"]
        )
        self.claimed_total = counter("claimed", "Tasks claimed by workers.", ["queue"])
        self.outcomes = {
            outcome: counter(outcome, f"Attempts that ended {outcome}.", ["kind", "queue"])
            for outcome in sorted(_OUTCOMES)
        }
        self.interrupted = counter(
            "interrupted", "Attempts cancelled, or whose completion was rejected.", ["reason"]
        )
        self.reclaimed_total = counter("reclaimed", "Tasks reclaimed after their lease.", [])
        self.claim_seconds = Histogram(
            "claim_seconds",
            "Time a claim statement took.",
            ["queue"],
            namespace=namespace,
            registry=registry,
        )
        self.handler_seconds = Histogram(
            "handler_seconds",
            "Time an attempt took, handler and outcome write.",
            ["kind", "queue"],
            namespace=namespace,
            registry=registry,
        )
        self.queue_depth = Gauge(
            "queue_depth",
            "Live tasks per queue and state.",
            ["queue", "state"],
            namespace=namespace,
            registry=registry,
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
        for row in stats:
            for state in ("available", "scheduled", "running"):
                self.queue_depth.labels(queue=row.queue, state=state).set(getattr(row, state))
