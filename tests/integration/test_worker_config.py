"""A worker that cannot serve what it was given says so: refused, warned, or visible in stats."""

from __future__ import annotations

import logging
import re

import pytest

import cyclone
from cyclone.testing.plugin import CycloneEnv


@cyclone.action("cfg.send", queue="cfg_mail")
async def send(ctx: cyclone.Context, n: int) -> None:
    return None


@cyclone.step("cfg.reserve", queue="cfg_orders")
async def reserve(ctx: cyclone.Context, n: int) -> int:
    return n


checkout = cyclone.define("cfg.checkout", int)
checkout.node(send, after=[checkout.node(reserve, name="reserve")])


# For the warning alone: a process warns once, whichever test builds a worker first.
@cyclone.step("cfg.pack", queue="cfg_orders")
async def pack(ctx: cyclone.Context, n: int) -> int:
    return n


shipping = cyclone.define("cfg.shipping", int)
shipping.node(send, after=[shipping.node(pack)])


def test_queues_leaving_out_a_steps_queue_are_refused(cyclone_env: CycloneEnv) -> None:
    client = cyclone_env.client
    with pytest.raises(cyclone.InvalidInputError) as refused:
        cyclone.Worker(client, steps=[send], queues={"cfg_bulk": 4})
    assert str(refused.value) == (
        "step 'cfg.send' runs on queue 'cfg_mail', which queues= leaves out: "
        'add "cfg_mail": N to queues=, or leave queues= unset'
    )
    with pytest.raises(cyclone.InvalidInputError) as refused:
        cyclone.Worker(client, workflows=[checkout], queues={"cfg_bulk": 4})
    assert str(refused.value) == (
        "workflow 'cfg.checkout' runs on queues 'cfg_mail', 'cfg_orders', which queues= "
        'leaves out: add "cfg_mail": N, "cfg_orders": N to queues=, or leave queues= unset'
    )
    # A queue no step uses is allowed: jobs enqueued there with queue= run on it.
    cyclone.Worker(client, steps=[send], queues={"cfg_mail": 1, "cfg_bulk": 4})


def test_a_step_without_its_workflow_is_warned_about_once(
    cyclone_env: CycloneEnv, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="cyclone"):
        cyclone.Worker(cyclone_env.client, steps=[pack])
        cyclone.Worker(cyclone_env.client, steps=[pack])
        cyclone.Worker(cyclone_env.client, workflows=[shipping], queues={"cfg_orders": 1})
        cyclone.Worker(cyclone_env.client, workflows=[shipping], queues={"cfg_orders": 1})
    messages = [r.getMessage() for r in caplog.records]
    assert messages == [
        "worker serves step 'cfg.pack' but not workflow 'cfg.shipping', which uses it: "
        "its nodes wait for a worker with workflows=[cfg.shipping]",
        "worker serves workflow 'cfg.shipping' but queues= leaves out its queue 'cfg_mail': "
        "those nodes wait for another worker with workflows=[cfg.shipping] that claims "
        "from them",
    ]


async def test_stats_show_unserved_work_and_live_workers(cyclone_env: CycloneEnv) -> None:
    client = cyclone_env.client
    run = await checkout.submit(client, 7)
    [before] = await client.stats()
    assert (before.queue, before.workers, before.unserved) == ("cfg_orders", 0, 1)
    assert before.unserved_work == [cyclone.UnservedWork("cfg.reserve", "cfg.checkout", 1)]
    worker = cyclone_env.worker(steps=[reserve])  # the step, but not the workflow
    async with worker:
        [during] = await client.stats()
        assert (during.workers, during.unserved) == (1, 1)
        with pytest.raises(TimeoutError) as timed_out:
            await run.wait(timeout=0.5)
        assert str(timed_out.value) == (
            f"run {run.id} did not end within 0.5 s: node 'reserve' (cfg.reserve) on queue "
            "'cfg_orders' is available and no live worker serves it"
        )
        [seen] = await client.workers()
        assert (seen.id, seen.queues, seen.kinds, seen.workflows) == (
            worker.id,
            ["cfg_orders"],
            ["cfg.reserve"],
            [],
        )
        assert seen.seen_at >= seen.started_at
        row = await cyclone_env.pool.fetchrow("SELECT * FROM cyclone_workers")
        assert (row["id"], row["queues"], row["kinds"], row["workflows"]) == (
            worker.id,
            ["cfg_orders"],
            ["cfg.reserve"],
            [],
        )
    [after] = await client.stats()
    assert (after.workers, after.unserved) == (0, 1)  # a graceful stop removes the worker
    assert await cyclone_env.pool.fetchval("SELECT count(*) FROM cyclone_workers") == 0
    assert await client.workers() == []
    async with cyclone_env.worker(workflows=[checkout]):
        assert await run.wait(timeout=30) is cyclone.RunState.COMPLETED


async def test_expired_workers_are_ignored_then_swept(cyclone_env: CycloneEnv) -> None:
    pool = cyclone_env.pool
    await pool.execute(
        "INSERT INTO cyclone_workers (id, host, pid, queues, kinds, workflows, expires_at)"
        " VALUES ('dead', 'h', 1, '{cfg_mail}', '{cfg.send}', '{}', now() - interval '1 s')"
    )
    run = await send.enqueue(cyclone_env.client, 1)
    [stats] = await cyclone_env.client.stats()
    assert (stats.workers, stats.unserved) == (0, 1)  # the dead worker serves nothing
    assert await cyclone_env.client.workers() == []
    with pytest.raises(TimeoutError, match=re.escape("job 'cfg.send' on queue 'cfg_mail'")):
        await run.wait(timeout=0.2)
    async with cyclone_env.worker(steps=[reserve]):  # its first heartbeat sweeps
        ids = [r["id"] for r in await pool.fetch("SELECT id FROM cyclone_workers")]
    assert "dead" not in ids
