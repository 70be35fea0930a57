"""Enqueueing in a transaction that writes the application's distributed tables, on a real
Citus cluster: Cyclone's tables on the coordinator, the application's ``orders`` table
distributed by tenant across two worker nodes. The job and the orders commit together or
not at all, across one shard or several: Citus commits a write to several nodes in two
phases, and a write to one node in one."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import pytest

import cyclone
from cyclone.testing.plugin import CycloneEnv
from tests.citus.cluster import prepared_on
from tests.conftest import fast_worker

ORDERS = """
CREATE TABLE orders (tenant_id int NOT NULL, id bigint NOT NULL, total int NOT NULL,
                     PRIMARY KEY (tenant_id, id));
SELECT create_distributed_table('orders', 'tenant_id');
"""


@cyclone.step("citus.receipt", queue="citus")
async def receipt(ctx: cyclone.Context, order: int) -> int:
    return order


async def tenants_on_two_nodes(env: CycloneEnv) -> tuple[int, int]:
    """Two tenants whose orders live on different worker nodes."""
    rows = await env.pool.fetch(
        "SELECT t, (SELECT nodeport FROM citus_shards s WHERE s.shardid ="
        " get_shard_id_for_distribution_column('orders', t)) AS port"
        " FROM generate_series(1, 50) t"
    )
    first = rows[0]
    other = next(r for r in rows if r["port"] != first["port"])
    return first["t"], other["t"]


async def counts(env: CycloneEnv) -> tuple[int, int]:
    orders = await env.pool.fetchval("SELECT count(*) FROM orders")
    runs = await env.pool.fetchval("SELECT count(*) FROM cyclone_runs")
    return orders, runs


async def test_the_cluster_spreads_orders_over_two_workers(citus_env: CycloneEnv) -> None:
    await citus_env.pool.execute(ORDERS)
    workers = await citus_env.pool.fetchval("SELECT count(*) FROM citus_get_active_worker_nodes()")
    assert workers == 2
    one, two = await tenants_on_two_nodes(citus_env)
    assert one != two


@contextlib.asynccontextmanager
async def remote_commands(conn: Any) -> AsyncIterator[list[str]]:
    """The commands Citus sends to other nodes for ``conn`` while the block runs."""
    sent: list[str] = []

    def keep(_conn: object, message: Any) -> None:
        sent.append(message.message)

    await conn.execute("SET citus.log_remote_commands = on; SET client_min_messages = log")
    conn.add_log_listener(keep)
    try:
        yield sent
    finally:
        conn.remove_log_listener(keep)
        await conn.execute("RESET citus.log_remote_commands; RESET client_min_messages")


async def test_a_job_commits_with_a_tenants_orders(citus_env: CycloneEnv) -> None:
    await citus_env.pool.execute(ORDERS)
    client = citus_env.client
    async with (
        citus_env.pool.acquire() as conn,
        remote_commands(conn) as sent,
        conn.transaction(),
    ):
        await conn.execute("INSERT INTO orders VALUES (7, 1, 100)")
        run = await receipt.enqueue_tx(client, conn, 1)
    assert await counts(citus_env) == (1, 1)
    # One worker node written: Cyclone's mark makes Citus prepare it, and commit it only once
    # the coordinator has (left to itself, Citus sends it a plain COMMIT before).
    assert prepared_on(sent) == 1, sent
    assert any(line.startswith("issuing COMMIT PREPARED") for line in sent), sent
    async with fast_worker(client, steps=[receipt]):
        assert await run.result(timeout=60) == 1


async def test_orders_on_two_nodes_and_a_job_commit_or_roll_back_together(
    citus_env: CycloneEnv,
) -> None:
    await citus_env.pool.execute(ORDERS)
    one, two = await tenants_on_two_nodes(citus_env)
    client = citus_env.client
    async with citus_env.pool.acquire() as conn:
        async with remote_commands(conn) as sent, conn.transaction():
            await conn.execute("INSERT INTO orders VALUES ($1, 1, 10), ($2, 1, 20)", one, two)
            await receipt.enqueue_tx(client, conn, 1)
        assert prepared_on(sent) == 2, sent
        assert await counts(citus_env) == (2, 1)
        # The second node refuses its write (a duplicate key): nothing of the transaction
        # stays, on either node or on the coordinator.
        with pytest.raises(asyncpg.UniqueViolationError):
            async with conn.transaction():
                await conn.execute("INSERT INTO orders VALUES ($1, 2, 10)", one)
                await receipt.enqueue_tx(client, conn, 2)
                await conn.execute("INSERT INTO orders VALUES ($1, 1, 20)", two)
    assert await counts(citus_env) == (2, 1)


async def test_a_rollback_drops_the_job_and_the_orders(citus_env: CycloneEnv) -> None:
    await citus_env.pool.execute(ORDERS)
    async with citus_env.pool.acquire() as conn:
        with pytest.raises(RuntimeError, match="declined"):
            async with conn.transaction():
                await conn.execute("INSERT INTO orders VALUES (3, 1, 100)")
                await receipt.enqueue_tx(citus_env.client, conn, 1)
                raise RuntimeError("payment declined")
    assert await counts(citus_env) == (0, 0)


async def test_a_commit_failing_at_the_coordinator_keeps_neither_the_orders_nor_the_job(
    citus_env: CycloneEnv,
) -> None:
    """One tenant's orders (one worker node) and a job, in a SERIALIZABLE transaction that
    fails at its commit on the coordinator: two transactions in write skew on a table of the
    coordinator, the second to commit canceled. Citus would have committed the worker node
    already had Cyclone not made it prepare the node first."""
    await citus_env.pool.execute(ORDERS)
    await citus_env.pool.execute(
        "CREATE TABLE on_call (doctor int PRIMARY KEY, on_duty bool NOT NULL);"
        "INSERT INTO on_call VALUES (1, true), (2, true)"
    )
    async with citus_env.pool.acquire() as first, citus_env.pool.acquire() as second:
        one = first.transaction(isolation="serializable")
        two = second.transaction(isolation="serializable")
        await one.start()
        await two.start()
        # Each reads that two doctors are on duty, then takes one off: write skew.
        for conn in (first, second):
            assert await conn.fetchval("SELECT count(*) FROM on_call WHERE on_duty") == 2
        await first.execute("UPDATE on_call SET on_duty = false WHERE doctor = 1")
        await second.execute("UPDATE on_call SET on_duty = false WHERE doctor = 2")
        await second.execute("INSERT INTO orders VALUES (7, 1, 100)")
        await receipt.enqueue_tx(citus_env.client, second, 1)
        await one.commit()
        with pytest.raises(asyncpg.SerializationError):
            await two.commit()
    assert await counts(citus_env) == (0, 0)
    assert await citus_env.pool.fetchval("SELECT count(*) FROM on_call WHERE on_duty") == 1
