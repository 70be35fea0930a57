"""The worker's timer: slots fire at their time (not at a maintenance pass), and run
deadlines and wait timeouts fire on time too; observers get each fired slot."""

from __future__ import annotations

import asyncio
import datetime as dt

from prometheus_client import CollectorRegistry

import cyclone
from cyclone.prometheus import PrometheusMetrics
from cyclone.testing.plugin import CycloneEnv
from tests.conftest import fast_worker

# Maintenance would take a minute to notice: whatever fires sooner is the timer.
SLOW_MAINTENANCE = {"maintenance_interval": 60.0}
started: list[dt.datetime] = []
three = asyncio.Event()


@cyclone.action("timer.tick")
async def tick(ctx: cyclone.Context, n: int) -> None:
    started.append(dt.datetime.now(dt.UTC))
    if len(started) >= 3:
        three.set()


@cyclone.action("timer.hang")
async def hang(ctx: cyclone.Context, n: int) -> None:
    await asyncio.sleep(3600)


@cyclone.step("timer.first")
async def first(ctx: cyclone.Context, n: int) -> int:
    return n


gate = cyclone.define("timer.gate", int)
gate.wait("approval", after=[gate.node(first)], timeout=1.0)


class Fired(cyclone.Observer):
    def __init__(self) -> None:
        self.lags: list[tuple[str, float]] = []

    def schedule_fired(self, schedule: str, lag: float) -> None:
        self.lags.append((schedule, lag))


async def test_slots_fire_at_their_time_and_are_reported(cyclone_env: CycloneEnv) -> None:
    client = cyclone_env.client
    fired, registry = Fired(), CollectorRegistry()
    client.observe(fired)
    client.observe(PrometheusMetrics(registry=registry))
    global three
    started.clear()
    three = asyncio.Event()
    s = cyclone.schedule("timer.every", tick, every=dt.timedelta(seconds=1), input=1)
    async with fast_worker(client, steps=[tick], schedules=[s], **SLOW_MAINTENANCE):
        await asyncio.wait_for(three.wait(), 60)
    page = await client.list_runs(cyclone.RunQuery(name="timer.tick"))
    prefix = "schedule:timer.every:"
    slots = {
        r.id: dt.datetime.fromisoformat(r.key.removeprefix(prefix)) for r in page.runs if r.key
    }
    assert len(slots) >= 3
    # Made at the slot, by the timer: the 5 s poll floor or the 60 s maintenance would be
    # seconds late (the bound is loose: the machine may be busy).
    assert all(
        dt.timedelta(0) <= r.created_at - slots[r.id] < dt.timedelta(seconds=2.5) for r in page.runs
    )
    assert len(fired.lags) >= 3 and {name for name, _ in fired.lags} == {"timer.every"}
    assert all(lag >= 0 for _, lag in fired.lags)
    count = registry.get_sample_value("cyclone_schedule_fired_total", {"schedule": "timer.every"})
    assert count == len(fired.lags)


async def test_a_run_deadline_fires_on_time_not_at_maintenance(cyclone_env: CycloneEnv) -> None:
    deadline = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=1.5)
    run = await hang.enqueue(cyclone_env.client, 1, run_deadline=deadline)
    async with fast_worker(cyclone_env.client, steps=[hang], **SLOW_MAINTENANCE):
        assert await run.wait(timeout=30) is cyclone.RunState.FAILED
    info = await run.info()
    assert info.finished_at is not None and info.finished_at >= deadline


async def test_a_wait_timeout_fires_on_time_not_at_maintenance(cyclone_env: CycloneEnv) -> None:
    run = await gate.submit(cyclone_env.client, 1)
    async with fast_worker(cyclone_env.client, workflows=[gate], **SLOW_MAINTENANCE):
        assert await run.wait(timeout=30) is cyclone.RunState.FAILED
    nodes = {n.name: n.state for n in (await run.info()).nodes}
    assert nodes["approval"] == "failed"
