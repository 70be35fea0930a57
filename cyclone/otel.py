"""OpenTelemetry tracing for Cyclone (``pip install 'cyclone-pg[otel]'``).

    from cyclone.otel import OpenTelemetryTracing
    client.observe(OpenTelemetryTracing())   # uses the global tracer provider

Each enqueue and submit gets a producer span, and its trace context is stored with the run;
each handler attempt gets a consumer span that is a child of it, so the work a request
enqueued shows up in that request's trace, however much later and wherever it runs.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping

from opentelemetry import metrics, propagate, trace

from cyclone._services.observe import Attributes, Observer

__all__ = ["OpenTelemetryTracing"]


class OpenTelemetryTracing(Observer):
    """An observer that traces enqueues and handler runs, joined by the stored context."""

    def __init__(
        self,
        tracer_provider: trace.TracerProvider | None = None,
        meter_provider: metrics.MeterProvider | None = None,
    ) -> None:
        self.tracer = trace.get_tracer("cyclone", tracer_provider=tracer_provider)
        meter = metrics.get_meter("cyclone", meter_provider=meter_provider)
        self.schedule_fired_counter = meter.create_counter(
            "cyclone.schedule.fired", description="Schedule slots whose run was made."
        )
        self.schedule_lag = meter.create_histogram(
            "cyclone.schedule.lag", unit="s", description="Time from a slot to its run's insert."
        )

    def schedule_fired(self, schedule: str, lag: float) -> None:
        attributes = {"cyclone.schedule": schedule}
        self.schedule_fired_counter.add(1, attributes)
        self.schedule_lag.record(lag, attributes)

    def trace_context(self) -> dict[str, str] | None:
        carrier: dict[str, str] = {}
        propagate.inject(carrier)
        return carrier or None

    @contextlib.contextmanager
    def enqueue_span(self, name: str, attributes: Attributes) -> Iterator[None]:
        with self.tracer.start_as_current_span(
            name, kind=trace.SpanKind.PRODUCER, attributes=dict(attributes)
        ):
            yield

    @contextlib.contextmanager
    def handler_span(
        self, name: str, carrier: Mapping[str, str] | None, attributes: Attributes
    ) -> Iterator[None]:
        parent = propagate.extract(dict(carrier)) if carrier else None
        with self.tracer.start_as_current_span(
            name, context=parent, kind=trace.SpanKind.CONSUMER, attributes=dict(attributes)
        ):
            yield
