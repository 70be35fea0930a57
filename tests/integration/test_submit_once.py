"""submit_once: one run per (workflow name, key), every rule of the reference page."""

from __future__ import annotations

import asyncio
import datetime as dt
from typing import Any

import asyncpg
import msgspec
import pytest

import cyclone
from cyclone.testing.plugin import CycloneEnv
from tests.conftest import count_rows, fast_worker, waiting_on_a_lock


class Order(msgspec.Struct):
    order_id: int
    lines: dict[str, int] = {}


@cyclone.step("once.reserve")
async def reserve(ctx: cyclone.Context, order: Order) -> int:
    if order.order_id < 0:
        raise RuntimeError("no such order")
    return order.order_id


checkout = cyclone.define_result("checkout", Order, int)
checkout.set_result(checkout.node(reserve))
refund = cyclone.define("refund", Order)
refund.node(reserve)


async def test_first_call_creates_later_calls_return_it(cyclone_env: CycloneEnv) -> None:
    client = cyclone_env.client
    run, created = await checkout.submit_once(client, "order:1", Order(1))
    assert created
    again, created_again = await checkout.submit_once(client, "order:1", Order(1))
    assert (again.id, created_again) == (run.id, False)
    # Each workflow name has its own keys.
    other, other_created = await refund.submit_once(client, "order:1", Order(1))
    assert other_created and other.id != run.id
    # Plain submit takes no key: each call makes a new run.
    a, b = await checkout.submit(client, Order(1)), await checkout.submit(client, Order(1))
    assert a.id != b.id
    assert await count_rows(cyclone_env, "cyclone_runs") == 4
    assert (await run.info()).key == "order:1"


async def test_result_through_an_existing_run(cyclone_env: CycloneEnv) -> None:
    run, _ = await checkout.submit_once(cyclone_env.client, "order:2", Order(2))
    async with fast_worker(cyclone_env.client, workflows=[checkout]):
        await run.wait(timeout=30)
    again, created = await checkout.submit_once(cyclone_env.client, "order:2", Order(2))
    assert not created
    assert await again.result(timeout=30) == 2


async def test_different_input_conflicts_and_writes_nothing(cyclone_env: CycloneEnv) -> None:
    client = cyclone_env.client
    run, _ = await checkout.submit_once(client, "order:3", Order(3))
    with pytest.raises(cyclone.SubmitConflictError) as raised:
        await checkout.submit_once(client, "order:3", Order(4))
    assert raised.value.run_id == run.id
    assert raised.value.key == "order:3"
    assert await count_rows(cyclone_env, "cyclone_runs") == 1
    assert await count_rows(cyclone_env, "cyclone_steps") == 1


async def test_inputs_compare_as_jsonb(cyclone_env: CycloneEnv) -> None:
    loose = cyclone.define("loose", dict[str, Any])
    loose.node(cyclone.register_kind("loose.step", dict[str, Any], None))
    run, _ = await loose.submit_once(cyclone_env.client, "k", {"a": 1, "b": [1, 2]})
    # Another key order encodes to other text; as jsonb the two are equal.
    same, created = await loose.submit_once(cyclone_env.client, "k", {"b": [1, 2], "a": 1})
    assert (same.id, created) == (run.id, False)
    with pytest.raises(cyclone.SubmitConflictError):
        await loose.submit_once(cyclone_env.client, "k", {"a": 1, "b": [2, 1]})


async def test_later_options_are_ignored(cyclone_env: CycloneEnv) -> None:
    deadline = dt.datetime.now(dt.UTC) + dt.timedelta(days=1)
    run, _ = await checkout.submit_once(cyclone_env.client, "k", Order(1), run_deadline=deadline)
    later = deadline + dt.timedelta(days=1)
    again, created = await checkout.submit_once(
        cyclone_env.client, "k", Order(1), run_deadline=later, priority=9
    )
    assert (again.id, created) == (run.id, False)
    stored = await cyclone_env.pool.fetchval(
        "SELECT deadline FROM cyclone_runs WHERE id = $1", run.id
    )
    assert stored == deadline


async def test_key_holds_in_every_state_until_purged(cyclone_env: CycloneEnv) -> None:
    client = cyclone_env.client
    ok, _ = await checkout.submit_once(client, "ok", Order(1))
    bad, _ = await checkout.submit_once(client, "bad", Order(-1))
    gone, _ = await checkout.submit_once(client, "gone", Order(5))
    await gone.cancel()
    async with fast_worker(client, workflows=[checkout], backoff=lambda a: 0):
        assert await ok.wait(timeout=60) is cyclone.RunState.COMPLETED
        assert await bad.wait(timeout=60) is cyclone.RunState.FAILED
    for key, run, order in [
        ("ok", ok, Order(1)),
        ("bad", bad, Order(-1)),
        ("gone", gone, Order(5)),
    ]:
        again, created = await checkout.submit_once(client, key, order)
        assert (again.id, created) == (run.id, False)  # a failed run is returned, not re-run
    assert await bad.status() is cyclone.RunState.FAILED

    assert await client.purge_terminal_runs(dt.timedelta(0)) == 3
    with pytest.raises(cyclone.RunNotFoundError):
        await ok.status()
    fresh, created = await checkout.submit_once(client, "ok", Order(1))
    assert created and fresh.id != ok.id


async def test_purge_respects_age_and_state(cyclone_env: CycloneEnv) -> None:
    client = cyclone_env.client
    run, _ = await checkout.submit_once(client, "k", Order(1))
    await run.cancel()
    assert await client.purge_terminal_runs(dt.timedelta(hours=1)) == 0  # too young
    assert await client.purge_terminal_runs(0, states=[cyclone.RunState.COMPLETED]) == 0
    pending, _ = await checkout.submit_once(client, "p", Order(1))
    assert await client.purge_terminal_runs(0) == 1
    assert await pending.status() is cyclone.RunState.PENDING  # never purges live runs


async def test_retention_sweeper_frees_keys(cyclone_env: CycloneEnv) -> None:
    client = cyclone.Client(
        cyclone_env.pool, retention=cyclone.Retention(cancelled=dt.timedelta(0), batch=2)
    )
    runs = [(await checkout.submit_once(client, f"k{i}", Order(i)))[0] for i in range(5)]
    for run in runs:
        await run.cancel()
    kept, _ = await checkout.submit_once(client, "kept", Order(9))
    worker = fast_worker(client, workflows=[checkout], maintenance_interval=3600)
    await worker.maintain_once()
    assert await count_rows(cyclone_env, "cyclone_runs") == 1
    assert await kept.status() is cyclone.RunState.PENDING
    _, created = await checkout.submit_once(client, "k0", Order(0))
    assert created
    with pytest.raises(cyclone.InvalidInputError):
        cyclone.Retention(failed=dt.timedelta(-1))


@pytest.mark.parametrize("first_commits", [True, False])
async def test_second_transaction_waits_for_the_first(
    cyclone_env: CycloneEnv, first_commits: bool
) -> None:
    client = cyclone_env.client
    async with cyclone_env.pool.acquire() as first, cyclone_env.pool.acquire() as second:
        tx1 = first.transaction()
        await tx1.start()
        run, created = await checkout.submit_once_tx(client, first, "k", Order(1))
        assert created

        async def other() -> tuple[cyclone.Run, bool]:
            async with second.transaction():
                return await checkout.submit_once_tx(client, second, "k", Order(1))

        waiting = asyncio.get_running_loop().create_task(other())
        await waiting_on_a_lock(cyclone_env, second.get_server_pid())
        assert not waiting.done()
        if first_commits:
            await tx1.commit()
        else:
            await tx1.rollback()
        again, again_created = await asyncio.wait_for(waiting, 30)
    if first_commits:
        assert (again.id, again_created) == (run.id, False)
    else:  # the rollback freed the key
        assert again_created and again.id != run.id
    assert await count_rows(cyclone_env, "cyclone_runs") == 1


async def test_same_key_twice_in_one_transaction(cyclone_env: CycloneEnv) -> None:
    async with cyclone_env.pool.acquire() as conn, conn.transaction():
        run, created = await checkout.submit_once_tx(cyclone_env.client, conn, "k", Order(1))
        again, again_created = await checkout.submit_once_tx(
            cyclone_env.client, conn, "k", Order(1)
        )
        assert created and not again_created and again.id == run.id
        with pytest.raises(cyclone.SubmitConflictError):
            await checkout.submit_once_tx(cyclone_env.client, conn, "k", Order(2))
        # The conflict did not abort the transaction.
        await conn.execute("CREATE TABLE after_conflict (x int)")
    assert await count_rows(cyclone_env, "cyclone_runs") == 1
    assert await cyclone_env.pool.fetchval("SELECT to_regclass('after_conflict') IS NOT NULL")


async def test_rollback_frees_the_key(cyclone_env: CycloneEnv) -> None:
    with pytest.raises(RuntimeError):
        async with cyclone_env.pool.acquire() as conn, conn.transaction():
            await checkout.submit_once_tx(cyclone_env.client, conn, "k", Order(1))
            raise RuntimeError("business write failed")
    _, created = await checkout.submit_once(cyclone_env.client, "k", Order(2))
    assert created


async def test_repeatable_read_gets_a_serialization_error(cyclone_env: CycloneEnv) -> None:
    async with cyclone_env.pool.acquire() as conn:
        tx = conn.transaction(isolation="repeatable_read")
        await tx.start()
        await conn.fetchval("SELECT 1")  # the snapshot is taken here
        await checkout.submit_once(cyclone_env.client, "k", Order(1))  # commits after it
        with pytest.raises(asyncpg.SerializationError) as raised:
            await checkout.submit_once_tx(cyclone_env.client, conn, "k", Order(1))
        assert raised.value.sqlstate == "40001"
        await tx.rollback()


@pytest.mark.parametrize("key", ["", "a\x00b", "\ud800", "x" * 257, 42])
async def test_bad_keys_write_nothing(cyclone_env: CycloneEnv, key: Any) -> None:
    with pytest.raises(cyclone.InvalidKeyError):
        await checkout.submit_once(cyclone_env.client, key, Order(1))
    async with cyclone_env.pool.acquire() as conn, conn.transaction():
        with pytest.raises(cyclone.InvalidKeyError):
            await checkout.submit_once_tx(cyclone_env.client, conn, key, Order(1))
    assert await count_rows(cyclone_env, "cyclone_runs") == 0
