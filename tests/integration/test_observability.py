"""Metrics and traces: Prometheus counts after a workload, database-wide gauges scraped once
over HTTP, one trace from enqueue to handler."""

from __future__ import annotations

import asyncio
import urllib.request
from collections import Counter
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

import cyclone
from cyclone.otel import OpenTelemetryTracing
from cyclone.prometheus import PrometheusMetrics, QueueCollector, serve_metrics
from cyclone.testing.plugin import CycloneEnv

seen: dict[str, int] = {}


@cyclone.step("obs.work", queue="obs", max_attempts=2)
async def work(ctx: cyclone.Context, mode: str) -> str:
    seen[mode] = seen.get(mode, 0) + 1
    if mode == "flaky" and seen[mode] == 1:
        raise RuntimeError("first try fails")
    if mode == "snooze" and seen[mode] == 1:
        raise cyclone.Snooze(0)
    if mode == "broken":
        raise RuntimeError("always fails")
    return mode


@cyclone.step("obs.parked", queue="obs_idle")
async def parked(ctx: cyclone.Context, n: int) -> None:
    return None


def scrape(url: str) -> dict[str, list[Any]]:
    """Each metric family's samples, from a real HTTP scrape (blocking: run it in a thread)."""
    with urllib.request.urlopen(url, timeout=30) as response:
        text = response.read().decode()
    names = Counter(f.name for f in text_string_to_metric_families(text))
    assert max(names.values()) == 1, names  # no family is exported twice
    return {f.name: f.samples for f in text_string_to_metric_families(text)}


async def test_prometheus_counts_a_workload(cyclone_env: CycloneEnv) -> None:
    seen.clear()
    registry = CollectorRegistry()
    client = cyclone_env.client
    client.observe(PrometheusMetrics(registry))
    await work.enqueue_many(client, ["ok"] * 5)
    for mode in ("flaky", "snooze", "broken"):
        await work.enqueue(client, mode)
    stuck = await work.enqueue(client, "ok", process_in=3600)
    await cyclone_env.drain(steps=[work], backoff=lambda attempt: 0)
    # A task whose worker died: running, lease long gone, then a maintenance pass.
    await cyclone_env.pool.execute(
        "UPDATE cyclone_tasks SET state = 'running', attempt = 1,"
        " lease_until = now() - interval '1 hour' WHERE run_id = $1",
        stuck.id,
    )
    await cyclone_env.worker(steps=[work]).maintain_once()

    def value(name: str, **labels: str) -> float | None:
        return registry.get_sample_value(name, labels)

    kind = {"kind": "obs.work", "queue": "obs"}
    assert value("cyclone_enqueued_total", **kind) == 9
    assert value("cyclone_claimed_total", queue="obs") == 5 + 2 + 2 + 2
    assert value("cyclone_completed_total", **kind) == 7
    assert value("cyclone_retried_total", **kind) == 2  # flaky and broken, once each
    assert value("cyclone_snoozed_total", **kind) == 1
    assert value("cyclone_failed_total", **kind) == 1
    assert value("cyclone_reclaimed_total") == 1
    assert value("cyclone_handler_seconds_count", **kind) == 11
    assert value("cyclone_claim_seconds_count", queue="obs") >= 1
    # Database-wide gauges are not a per-process observer's (QueueCollector has them).
    assert value("cyclone_queue_depth", queue="obs", state="available") is None


class Exploding(cyclone.Observer):
    def enqueued(self, kind: str, queue: str, count: int) -> None:
        raise RuntimeError("observer bug")

    def trace_context(self) -> dict[str, str] | None:
        raise RuntimeError("observer bug")

    def enqueue_span(self, name: str, attributes: Any) -> Any:
        raise RuntimeError("observer bug")


async def test_a_failing_observer_does_not_break_work(
    cyclone_env: CycloneEnv, caplog: pytest.LogCaptureFixture
) -> None:
    cyclone_env.client.observe(Exploding())
    run = await work.enqueue(cyclone_env.client, "ok")
    assert await run.status() is cyclone.RunState.PENDING
    for hook in ("enqueued", "trace_context", "enqueue_span"):
        assert f"failed in {hook}" in caplog.text
    with pytest.raises(cyclone.InvalidInputError):
        cyclone_env.client.observe(object())  # type: ignore[arg-type]


async def test_handler_span_joins_the_enqueuing_trace(cyclone_env: CycloneEnv) -> None:
    seen.clear()
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    client = cyclone_env.client
    client.observe(OpenTelemetryTracing(tracer_provider=provider))
    tracer = provider.get_tracer("app")
    with tracer.start_as_current_span("POST /work"):
        run = await work.enqueue(client, "ok")
    await cyclone_env.drain(steps=[work])
    assert await run.status() is cyclone.RunState.COMPLETED
    spans = {s.name: s for s in exporter.get_finished_spans()}
    request, enqueue, handler = (
        spans["POST /work"],
        spans["enqueue obs.work"],
        spans["run obs.work"],
    )
    assert enqueue.context.trace_id == request.context.trace_id
    assert handler.context.trace_id == request.context.trace_id  # one trace, end to end
    assert handler.parent is not None and handler.parent.span_id == enqueue.context.span_id
    assert handler.kind is trace.SpanKind.CONSUMER
    assert handler.attributes is not None and handler.attributes["cyclone.run_id"] == str(run.id)


async def test_queue_gauges_come_once_from_the_collector(cyclone_env: CycloneEnv) -> None:
    client = cyclone_env.client
    registry = CollectorRegistry()
    server = serve_metrics(client, 0, queue_metrics=True, registry=registry)
    url = f"http://127.0.0.1:{server.server_port}/metrics"
    try:
        await work.enqueue_many(client, ["ok"] * 3, process_in=3600)
        await parked.enqueue(client, 1)  # on a queue no worker claims from
        # Two workers in this process, each reporting to the client's observers: the
        # database-wide gauges still come once, from the one collector.
        async with cyclone_env.worker(steps=[work]), cyclone_env.worker(steps=[work]):
            families = await asyncio.to_thread(scrape, url)
        samples = {
            (s.name, tuple(sorted(s.labels.items()))): s.value
            for samples in families.values()
            for s in samples
        }

        def gauge(name: str, **labels: str) -> float:
            return samples[(name, tuple(sorted(labels.items())))]

        assert gauge("cyclone_queue_depth", queue="obs", state="scheduled") == 3
        assert gauge("cyclone_queue_depth", queue="obs_idle", state="available") == 1
        assert gauge("cyclone_queue_workers", queue="obs") == 2
        assert gauge("cyclone_queue_workers", queue="obs_idle") == 0
        assert gauge("cyclone_queue_oldest_available_seconds", queue="obs_idle") >= 0
        assert (
            gauge("cyclone_queue_unserved", queue="obs_idle", kind="obs.parked", workflow="") == 1
        )
        assert gauge("cyclone_queue_stats_up") == 1
        # The worker's own counters are on the same endpoint, once.
        assert "cyclone_claim_seconds" in families
    finally:
        server.shutdown()
        server.server_close()


async def test_collector_reports_a_failed_read(cyclone_env: CycloneEnv) -> None:
    registry = CollectorRegistry()
    QueueCollector(cyclone_env.client, registry=registry)
    # Scraped from the event loop's own thread, it cannot wait for the read: it says so.
    assert registry.get_sample_value("cyclone_queue_stats_up") == 0
    assert await asyncio.to_thread(registry.get_sample_value, "cyclone_queue_stats_up") == 1
