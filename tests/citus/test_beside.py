"""Cyclone on a Citus coordinator beside the application's tables distributed by tenant:
completion transactions that write a tenant's orders, workflows submitted with orders,
signals, cancel, flow control, schedules, the synchronous client, the dashboard and the CLI.
Each test checks what was stored and listed, not only that nothing failed."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import httpx
import psycopg
import psycopg_pool
import pytest

import cyclone
import cyclone.sync
import cyclone.web
from cyclone.testing.plugin import CycloneEnv
from tests.citus.cluster import prepared_on
from tests.cli.process import cli
from tests.conftest import Listener, fast_worker, listening

ORDERS = """
CREATE TABLE orders (tenant_id int NOT NULL, id bigint NOT NULL, attempt int NOT NULL,
                     PRIMARY KEY (tenant_id, id));
SELECT create_distributed_table('orders', 'tenant_id');
"""
TENANTS = 8


@pytest.fixture(autouse=True)
async def _orders(citus_env: CycloneEnv) -> None:
    await citus_env.pool.execute(ORDERS)


@pytest.fixture
async def listener(citus_env: CycloneEnv) -> AsyncIterator[Listener]:
    """A LISTEN on the coordinator, on the client's channel."""
    async with listening(citus_env) as heard:
        yield heard


@cyclone.step("citus.ship", queue="citus")
async def ship(ctx: cyclone.Context, order: int) -> int:
    """Write the order on its tenant's node in the completion transaction; odd orders fail
    their first attempt after writing it, which must roll the write back."""
    conn = await ctx.completion_tx()
    await conn.execute(
        "INSERT INTO orders VALUES ($1, $2, $3)", order % TENANTS, order, ctx.attempt
    )
    if order % 2 and ctx.attempt == 1:
        raise RuntimeError(f"order {order}: the carrier is busy")
    return order


checkout = cyclone.define("citus.checkout", int)
approved = checkout.wait("approved", payload=bool)
checkout.node(ship, name="ship", after=[approved], input=lambda order, _outputs: order)


async def orders(env: CycloneEnv) -> list[tuple[int, int]]:
    rows = await env.pool.fetch("SELECT id, attempt FROM orders ORDER BY id")
    return [(r["id"], r["attempt"]) for r in rows]


async def test_completion_transactions_write_each_order_once(
    citus_env: CycloneEnv, listener: Listener
) -> None:
    client = citus_env.client
    runs = [await ship.enqueue(client, n, max_attempts=3) for n in range(20)]
    await listener.settle()
    assert listener.counts()["q:citus"] >= 1  # the enqueues' wakeups reached the listener
    async with fast_worker(client, steps=[ship]):
        assert [await run.result(timeout=60) for run in runs] == list(range(20))
    # Odd orders failed once after writing: their first write rolled back with the attempt.
    assert await orders(citus_env) == [(n, 2 if n % 2 else 1) for n in range(20)]
    completed = cyclone.RunQuery(state=cyclone.RunState.COMPLETED, name="citus.ship")
    assert await client.count_runs(completed) == 20
    page = await client.list_runs(completed)
    assert sorted(r.id for r in page.runs) == sorted(r.id for r in runs)
    [stats] = [s for s in await client.stats() if s.queue == "citus"]
    assert stats.completed_last_minute == 20


# Each pool connection hears what Citus sends the nodes from the moment it is taken; asyncpg
# warns of the listener as the connection goes back, and drops it.
@pytest.mark.filterwarnings("ignore:.*active log listener:asyncpg.InterfaceWarning")
async def test_a_completion_transaction_prepares_the_node_of_its_order(
    citus_env: CycloneEnv,
) -> None:
    """A handler's completion transaction that writes one tenant's order (one worker node):
    Citus prepares the node and commits it after the coordinator, as for a caller's."""
    sent: list[str] = []

    async def log_remote(conn: Any) -> None:
        conn.add_log_listener(lambda _conn, message: sent.append(message.message))

    remote = {"citus.log_remote_commands": "on", "client_min_messages": "log"}
    async with asyncpg.create_pool(citus_env.dsn, server_settings=remote, setup=log_remote) as pool:
        client = cyclone.Client(pool)
        run = await ship.enqueue(client, 2)  # even: it completes at its first attempt
        async with fast_worker(client, steps=[ship]):
            assert await run.result(timeout=60) == 2
    assert await orders(citus_env) == [(2, 1)]
    assert prepared_on(sent) == 1, sent
    assert any(line.startswith("issuing COMMIT PREPARED") for line in sent), sent


async def test_a_workflow_submitted_with_an_order_waits_for_its_signal(
    citus_env: CycloneEnv,
) -> None:
    client = citus_env.client
    async with citus_env.pool.acquire() as conn, conn.transaction():
        await conn.execute("INSERT INTO orders VALUES (3, 1000, 0)")
        kept = await checkout.submit_tx(client, conn, 1001)
    with pytest.raises(RuntimeError, match="declined"):
        async with citus_env.pool.acquire() as conn, conn.transaction():
            await conn.execute("INSERT INTO orders VALUES (4, 2000, 0)")
            await checkout.submit_tx(client, conn, 2001)
            raise RuntimeError("payment declined")
    dropped = await checkout.submit(client, 3001)
    assert await orders(citus_env) == [(1000, 0)]
    assert await client.count_runs(cyclone.RunQuery(name="citus.checkout")) == 2
    async with fast_worker(client, steps=[ship], workflows=[checkout]):
        assert await dropped.cancel()
        await client.signal(kept.id, "approved", True)
        assert await kept.wait(timeout=60) is cyclone.RunState.COMPLETED
        assert await dropped.status() is cyclone.RunState.CANCELLED
    # Order 1001 is odd: its first attempt's write rolled back, the retry's stayed.
    assert await orders(citus_env) == [(1000, 0), (1001, 2)]


async def test_a_paused_queue_and_a_triggered_schedule(citus_env: CycloneEnv) -> None:
    client = citus_env.client
    await client.queues.pause("citus", create=True)
    run = await ship.enqueue(client, 42)
    nightly = cyclone.schedule("citus.nightly", ship, cron="0 3 * * *", input=44)
    await client.schedules.create(nightly)
    async with fast_worker(client, steps=[ship]):
        why = await client.explain(run.id)
        assert "paused" in str(why)
        await client.queues.resume("citus")
        assert await run.result(timeout=60) == 42
        key = await client.schedules.trigger("citus.nightly")
        async with asyncio.timeout(60):  # the worker's scheduler fires it: nothing to await
            while (fired := await client.list_runs(cyclone.RunQuery(key=key))).runs == []:  # noqa: ASYNC110
                await asyncio.sleep(0.05)
        assert await (await client.get_run(fired.runs[0].id, int)).result(timeout=60) == 44
    assert await orders(citus_env) == [(42, 1), (44, 1)]


def test_the_synchronous_client_writes_beside_orders(citus_env: CycloneEnv) -> None:
    remote: list[str] = []
    with psycopg_pool.ConnectionPool(citus_env.dsn, min_size=1, max_size=2) as pool:
        client = cyclone.sync.Client(pool)
        with pool.connection() as conn:
            conn.autocommit = True  # each transaction() below is a transaction, not a savepoint
            conn.add_notice_handler(lambda notice: remote.append(notice.message_primary or ""))
            conn.execute("SET citus.log_remote_commands = on")
            conn.execute("SET client_min_messages = log")
            with conn.transaction():
                conn.execute("INSERT INTO orders VALUES (5, 7, 0)")
                run = client.enqueue_tx(conn, ship, 7)
            conn.execute("RESET citus.log_remote_commands")
            conn.execute("RESET client_min_messages")
            with pytest.raises(psycopg.errors.UniqueViolation), conn.transaction():
                client.enqueue_tx(conn, ship, 8)
                conn.execute("INSERT INTO orders VALUES (5, 7, 0)")  # a duplicate
        assert client.get_run(run.id).status() is cyclone.RunState.PENDING
        assert [r.id for r in client.list_runs().runs] == [run.id]
    # One worker node written, prepared and committed after the coordinator.
    assert prepared_on(remote) == 1, remote


async def test_the_dashboard_and_the_cli_list_what_ran(citus_env: CycloneEnv) -> None:
    client = citus_env.client
    runs = [await ship.enqueue(client, n) for n in (2, 4, 6)]
    async with fast_worker(client, steps=[ship]):
        for run in runs:
            await run.result(timeout=60)
    app = cyclone.web.dashboard(client)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as http:
        page = await http.get("/runs", params={"name": "citus.ship"})
        assert page.status_code == 200
        assert all(str(run.id) in page.text for run in runs)
        shown = await http.get(f"/runs/{runs[0].id}")
        assert shown.status_code == 200 and "completed" in shown.text
    code, out, err = await cli("runs", "ls", "--json", dsn=citus_env.dsn)
    assert code == 0, err
    listed: list[dict[str, Any]] = json.loads(out)["runs"]
    assert sorted(r["id"] for r in listed) == sorted(str(run.id) for run in runs)
    code, out, err = await cli("stats", dsn=citus_env.dsn)
    assert code == 0 and "citus" in out, err
