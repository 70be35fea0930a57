"""Catch-up, overlap, pause/resume, trigger, dynamic schedules and deploys, on real
PostgreSQL. The firing pass takes the database's "now" as a parameter, so slots are moved
through without waiting."""

from __future__ import annotations

import asyncio
import datetime as dt
from typing import Any

import pytest

import cyclone
from cyclone._model.schedules import slot_key
from cyclone._worker.ports import insert_parts
from cyclone._worker.scheduler import Scheduler
from cyclone.testing.plugin import CycloneEnv
from tests.conftest import fast_worker


@cyclone.action("pol.job")
async def job(ctx: cyclone.Context, slot: str) -> None:
    return None


@cyclone.step("pol.node")
async def node(ctx: cyclone.Context, n: int) -> int:
    return n


triggered = asyncio.Event()


@cyclone.action("pol.signal")
async def signal_job(ctx: cyclone.Context, slot: str) -> None:
    triggered.set()


flow = cyclone.define("pol.flow", int)
flow.node(node)

MINUTE = dt.timedelta(minutes=1)


def every_minute(name: str = "pol.minutely", **options: Any) -> cyclone.Schedule[str]:
    return cyclone.schedule(name, job, every=MINUTE, input=lambda slot: slot.isoformat(), **options)


def scheduler(env: CycloneEnv, *schedules: cyclone.Schedule[Any], **kw: Any) -> Scheduler:
    return Scheduler(
        env.client.services,
        insert_parts(env.client),
        schedules,
        kinds={"pol.job": job, "pol.node": node},
        workflows={"pol.flow": flow},
        worker_id="test",
        **kw,
    )


async def keys(env: CycloneEnv, name: str = "pol.job") -> list[str]:
    rows = await env.pool.fetch("SELECT key FROM cyclone_runs WHERE name = $1 ORDER BY key", name)
    return [r["key"] for r in rows]


async def declared(env: CycloneEnv, s: cyclone.Schedule[Any]) -> tuple[Scheduler, dt.datetime]:
    sched = scheduler(env, s)
    await sched.declare()
    return sched, (await env.client.schedules.get(s.name)).next_at


def slots(name: str, first: dt.datetime, *minutes: int) -> list[str]:
    return [slot_key(name, first + m * MINUTE) for m in minutes]


async def test_catch_up_skip_runs_only_slots_due_now(cyclone_env: CycloneEnv) -> None:
    s = every_minute()
    sched, first = await declared(cyclone_env, s)
    assert await sched.fire_due(now=first - dt.timedelta(seconds=1)) == 0  # not due yet
    assert await sched.fire_due(now=first) == 1
    await sched.fire_due(now=first + 30 * MINUTE)  # 29 missed slots, one on time
    assert await keys(cyclone_env) == slots(s.name, first, 0, 30)
    info = await cyclone_env.client.schedules.get(s.name)
    assert info.next_at == first + 31 * MINUTE and info.last_slot == first + 30 * MINUTE
    run = await cyclone_env.client.get_run(info.last_run_id)  # type: ignore[arg-type]
    assert (await run.info()).key == slot_key(s.name, first + 30 * MINUTE)


async def test_catch_up_latest_runs_the_newest_missed_slot(cyclone_env: CycloneEnv) -> None:
    s = every_minute(catch_up="latest")
    sched, first = await declared(cyclone_env, s)
    await sched.fire_due(now=first + 30 * MINUTE + dt.timedelta(seconds=30))
    assert await keys(cyclone_env) == slots(s.name, first, 30)  # 30 is the newest, missed


async def test_catch_up_all_runs_the_missed_slots_of_the_window(cyclone_env: CycloneEnv) -> None:
    s = every_minute(catch_up="all", catch_up_window=dt.timedelta(minutes=5))
    sched, first = await declared(cyclone_env, s)
    await sched.fire_due(now=first + 30 * MINUTE)
    assert await keys(cyclone_env) == slots(s.name, first, 25, 26, 27, 28, 29, 30)


async def test_overlap_skip_drops_slots_while_the_last_run_is_active(
    cyclone_env: CycloneEnv,
) -> None:
    s = every_minute(overlap="skip")
    sched, first = await declared(cyclone_env, s)
    await sched.fire_due(now=first)
    await sched.fire_due(now=first + MINUTE)  # the first run is still pending: skipped
    assert await keys(cyclone_env) == slots(s.name, first, 0)
    await cyclone_env.drain(steps=[job])
    await sched.fire_due(now=first + 2 * MINUTE)
    assert await keys(cyclone_env) == slots(s.name, first, 0, 2)


async def test_overlap_allow_runs_every_slot(cyclone_env: CycloneEnv) -> None:
    s = every_minute()
    sched, first = await declared(cyclone_env, s)
    for m in range(3):
        await sched.fire_due(now=first + m * MINUTE)
    assert await keys(cyclone_env) == slots(s.name, first, 0, 1, 2)


async def test_pause_then_resume_from_the_next_slot(cyclone_env: CycloneEnv) -> None:
    s = every_minute()
    sched, first = await declared(cyclone_env, s)
    await cyclone_env.client.schedules.pause(s.name)
    assert (await cyclone_env.client.schedules.get(s.name)).paused
    await sched.fire_due(now=first + 3 * MINUTE)
    assert await keys(cyclone_env) == []
    await sched.declare()  # a deploy keeps it paused
    assert (await cyclone_env.client.schedules.get(s.name)).paused
    await cyclone_env.client.schedules.resume(s.name)
    info = await cyclone_env.client.schedules.get(s.name)
    assert not info.paused and info.next_at > dt.datetime.now(dt.UTC)
    await sched.fire_due(now=info.next_at)
    assert await keys(cyclone_env) == [slot_key(s.name, info.next_at)]


async def test_trigger_makes_one_run_now_even_when_paused(cyclone_env: CycloneEnv) -> None:
    s = every_minute()
    sched, _ = await declared(cyclone_env, s)
    await cyclone_env.client.schedules.pause(s.name)
    key = await cyclone_env.client.schedules.trigger(s.name)
    assert await cyclone_env.client.schedules.trigger(s.name) == key  # not fired yet: the same
    assert key.startswith(f"schedule:{s.name}:trigger:")
    await sched.fire_due()
    await sched.fire_due()
    assert await keys(cyclone_env) == [key]
    page = await cyclone_env.client.list_runs(cyclone.RunQuery(key=key))
    assert [r.name for r in page.runs] == ["pol.job"]
    assert (await cyclone_env.client.schedules.get(s.name)).triggered_at is None


async def test_a_running_worker_fires_a_trigger_at_once(cyclone_env: CycloneEnv) -> None:
    global triggered
    triggered = asyncio.Event()
    s = cyclone.schedule("pol.yearly", signal_job, cron="@yearly", input="x")
    async with fast_worker(cyclone_env.client, steps=[signal_job], schedules=[s]):
        key = await cyclone_env.client.schedules.trigger(s.name)
        await asyncio.wait_for(triggered.wait(), 30)  # woken by the NOTIFY, not the 5 s poll
    page = await cyclone_env.client.list_runs(cyclone.RunQuery(key=key))
    assert [r.name for r in page.runs] == ["pol.signal"]


async def test_dynamic_schedules_create_update_delete(cyclone_env: CycloneEnv) -> None:
    schedules = cyclone_env.client.schedules
    sched = scheduler(cyclone_env)  # declares nothing; serves pol.job and pol.flow
    info = await schedules.create(cyclone.schedule("pol.dyn", flow, every=MINUTE, input=5))
    assert info.dynamic and info.declared and info.target == "pol.flow" and not info.job
    with pytest.raises(cyclone.InvalidStateError, match="exists already"):
        await schedules.create(cyclone.schedule("pol.dyn", flow, every=MINUTE, input=5))
    await sched.fire_due(now=info.next_at)
    assert await keys(cyclone_env, "pol.flow") == [slot_key("pol.dyn", info.next_at)]
    updated = await schedules.update(
        cyclone.schedule("pol.dyn", flow, cron="0 3 * * *", tz="Europe/Paris", input=6)
    )
    assert updated.cron == "0 3 * * *" and updated.every is None
    assert updated.next_at.astimezone(dt.timezone(dt.timedelta(hours=1))).hour in (2, 3)
    await sched.fire_due(now=updated.next_at)
    runs = (await cyclone_env.client.list_runs(cyclone.RunQuery(name="pol.flow"))).runs
    assert runs[0].key == slot_key("pol.dyn", updated.next_at)
    payload = await cyclone_env.pool.fetchval(
        "SELECT input FROM cyclone_runs WHERE id = $1", runs[0].id
    )
    assert payload == "6"
    await schedules.delete("pol.dyn")
    with pytest.raises(cyclone.ScheduleNotFoundError, match=r"no schedule named 'pol\.dyn'"):
        await schedules.get("pol.dyn")
    assert await sched.fire_due(now=updated.next_at + dt.timedelta(days=1)) == 0


async def test_dynamic_schedules_fire_only_where_the_target_is_served(
    cyclone_env: CycloneEnv,
) -> None:
    info = await cyclone_env.client.schedules.create(
        cyclone.schedule("pol.dyn-job", job, every=MINUTE, input="x")
    )
    client = cyclone_env.client
    other = Scheduler(
        client.services, insert_parts(client), [], kinds={}, workflows={}, worker_id="other"
    )
    assert await other.fire_due(now=info.next_at) == 0
    assert await scheduler(cyclone_env).fire_due(now=info.next_at) == 1


async def test_bad_changes_are_refused_and_write_nothing(cyclone_env: CycloneEnv) -> None:
    schedules = cyclone_env.client.schedules
    with pytest.raises(cyclone.InvalidScheduleError, match="input must be a value"):
        await schedules.create(every_minute("pol.fn"))
    with pytest.raises(cyclone.ScheduleNotFoundError):
        await schedules.update(cyclone.schedule("pol.none", job, every=MINUTE, input="x"))
    for call in (schedules.pause, schedules.resume, schedules.trigger, schedules.delete):
        with pytest.raises(cyclone.ScheduleNotFoundError):
            await call("pol.none")
    assert await cyclone_env.pool.fetchval("SELECT count(*) FROM cyclone_schedules") == 0
    s = every_minute()
    await scheduler(cyclone_env, s).declare()
    with pytest.raises(cyclone.InvalidStateError, match="declared in code"):
        await schedules.update(cyclone.schedule(s.name, job, every=MINUTE, input="x"))
    with pytest.raises(cyclone.InvalidStateError, match="still declared by a running worker"):
        await schedules.delete(s.name)
    with pytest.raises(cyclone.InvalidScheduleError, match="two schedules are named"):
        fast_worker(cyclone_env.client, steps=[job], schedules=[s, every_minute()])


async def test_a_deploy_that_renames_a_schedule_stops_the_old_one(
    cyclone_env: CycloneEnv,
) -> None:
    old = cyclone.schedule("pol.old", job, every=dt.timedelta(seconds=1), input="o")
    new = cyclone.schedule("pol.new", job, every=dt.timedelta(seconds=1), input="n")
    before = scheduler(cyclone_env, old, lease=1.0)
    await before.declare()
    first = (await cyclone_env.client.schedules.get("pol.old")).next_at
    await before.fire_due(now=first)
    after = scheduler(cyclone_env, new, lease=1.0)  # the new deploy: the old one is gone
    await after.declare()
    later = first + dt.timedelta(seconds=3)
    await after.fire_due(now=later)
    made = await keys(cyclone_env)
    assert [k for k in made if k.startswith("schedule:pol.old:")] == [slot_key("pol.old", first)]
    assert slot_key("pol.new", later) in made
    await asyncio.sleep(1.1)  # the old declaration's 1 s lease runs out
    assert not (await cyclone_env.client.schedules.get("pol.old")).declared
    await cyclone_env.client.schedules.delete("pol.old")
    assert [i.name for i in await cyclone_env.client.schedules.list()] == ["pol.new"]


async def test_a_changed_timing_moves_the_next_slot_and_an_unchanged_one_keeps_it(
    cyclone_env: CycloneEnv,
) -> None:
    sched, first = await declared(cyclone_env, every_minute())
    await cyclone_env.pool.execute(
        "UPDATE cyclone_schedules SET next_at = next_at - interval '1 hour'"
    )
    await sched.declare()  # a restart with the same timing: the place is kept
    kept = (await cyclone_env.client.schedules.get("pol.minutely")).next_at
    assert kept == first - dt.timedelta(hours=1)
    five = cyclone.schedule("pol.minutely", job, cron="*/5 * * * *", input="x")
    await scheduler(cyclone_env, five).declare()
    moved = await cyclone_env.client.schedules.get("pol.minutely")
    assert moved.cron == "*/5 * * * *" and moved.next_at > dt.datetime.now(dt.UTC)
