"""Raise sites that need a database: each raises its typed Cyclone error."""

from __future__ import annotations

import pytest

import cyclone
from cyclone.testing.plugin import CycloneEnv
from tests.conftest import fast_worker


@cyclone.step("errors.fails", max_attempts=1)
async def fails(ctx: cyclone.Context, value: int) -> int:
    raise RuntimeError("this step always fails")


@cyclone.step("errors.job")
async def job(ctx: cyclone.Context, value: int) -> int:
    return value


broken = cyclone.define("errors.broken", int)
broken.node(fails)
gated = cyclone.define("errors.gated", int)
gated.wait("approval")


async def test_unknown_nodes_of_a_run(cyclone_env: CycloneEnv) -> None:
    client = cyclone_env.client
    waiting = await gated.submit(client, 1)
    with pytest.raises(cyclone.UnknownNodeError, match="has no node 'nope'") as caught:
        await client.signal(waiting.id, "nope", None)
    assert caught.value.node == "nope"
    queued = await job.enqueue(client, 1)
    with pytest.raises(cyclone.UnknownNodeError, match="has no node 'other'"):
        await queued.retry("other")
    failed = await broken.submit(client, 1)
    async with fast_worker(client, workflows=[broken]):
        assert await failed.wait(timeout=30) is cyclone.RunState.FAILED
    with pytest.raises(cyclone.UnknownNodeError, match="has no node 'nope'"):
        await failed.retry("nope")


async def test_a_worker_started_twice(cyclone_env: CycloneEnv) -> None:
    async with cyclone_env.worker(steps=[job]) as worker:
        with pytest.raises(cyclone.LifecycleError, match="started already"):
            await worker.start()


async def test_a_tracked_transaction_used_once_it_ended(cyclone_env: CycloneEnv) -> None:
    async with cyclone_env.pool.acquire() as conn:
        tracked, _ = cyclone.track_wakeups(conn)
        tx = tracked.transaction()
        await tx.start()
        await tx.commit()
        with pytest.raises(cyclone.LifecycleError, match="not open"):
            await tx.commit()


async def test_a_key_that_keeps_changing_hands(cyclone_env: CycloneEnv) -> None:
    # A trigger that drops every run insert stands in for the key's run being purged between
    # the insert that found the key taken and the look-up of its run, every time.
    await cyclone_env.pool.execute(
        """
        CREATE FUNCTION drop_row() RETURNS trigger LANGUAGE plpgsql AS 'BEGIN RETURN NULL; END';
        CREATE TRIGGER drop_runs BEFORE INSERT ON cyclone_runs
            FOR EACH ROW EXECUTE FUNCTION drop_row();
        """
    )
    with pytest.raises(cyclone.KeyContentionError, match=r"submit key 'k' of 'errors\.gated'"):
        await gated.submit_once(cyclone_env.client, "k", 1)
    with pytest.raises(cyclone.KeyContentionError, match=r"unique key 'u' of 'errors\.job'"):
        await job.enqueue(cyclone_env.client, 1, unique="u")
