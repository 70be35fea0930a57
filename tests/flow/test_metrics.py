"""Paused and limited queues in the Prometheus QueueCollector."""

from __future__ import annotations

import asyncio

from prometheus_client import CollectorRegistry

from cyclone.prometheus import QueueCollector
from cyclone.testing.plugin import CycloneEnv


async def test_collector_shows_paused_and_limited_queues(cyclone_env: CycloneEnv) -> None:
    queues = cyclone_env.client.queues
    await queues.set_limits("api", concurrency=3, rate=120, per=60, create=True)
    await queues.pause("api")
    await queues.set_limits("bulk", key_concurrency=2, key_rate=30, key_per=60, create=True)
    registry = CollectorRegistry()
    QueueCollector(cyclone_env.client, registry=registry)

    def sample(name: str, **labels: str) -> float | None:
        return registry.get_sample_value(f"cyclone_{name}", labels)

    assert await asyncio.to_thread(sample, "queue_paused", queue="api") == 1
    assert await asyncio.to_thread(sample, "queue_paused", queue="bulk") == 0
    limit = "queue_limit"
    assert await asyncio.to_thread(sample, limit, queue="api", limit="concurrency") == 3
    assert await asyncio.to_thread(sample, limit, queue="api", limit="rate_per_second") == 2
    assert await asyncio.to_thread(sample, limit, queue="bulk", limit="key_concurrency") == 2
    key_rate = await asyncio.to_thread(sample, limit, queue="bulk", limit="key_rate_per_second")
    assert key_rate == 0.5
    assert await asyncio.to_thread(sample, limit, queue="bulk", limit="concurrency") is None
