"""Fault injection on a Citus cluster: a coordinator and two worker nodes, each a server of
the scenario's own, Cyclone's tables on the coordinator and the application's ``chaos_orders``
distributed by tenant over both worker nodes.

Every handler writes its effect (on the coordinator) and an order row (on its tenant's worker
node) in its completion transaction, so a completion spans two nodes and Citus commits it in
two phases. A worker node stopped under load fails the completions that write to it, with an
error naming the node, and their attempts come back as retries, while the runs of the other
node's tenants go on completing; a coordinator restarted under load is a database restart to
Cyclone, which its clients and workers ride out. Beyond the ledger's guarantees, each scenario
checks that the effects and the orders hold exactly the same attempts, once Citus has settled
the transactions a node's absence left prepared (it does on a timer, every second here).
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import asyncpg
import pytest
import pytest_asyncio

from cyclone.testing._citus import CITUS_SETTINGS, form_database
from tests.chaos.app import TENANTS
from tests.chaos.cluster import Cluster, cluster_from
from tests.chaos.harness import Scene
from tests.chaos.test_scenarios import restart, run
from tests.citus.cluster import SESSIONS, require_citus

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(420)]

ORDERS = f"""
CREATE TABLE chaos_orders (tenant int NOT NULL, run_id uuid NOT NULL, node text NOT NULL,
                           attempt int NOT NULL);
SELECT create_distributed_table('chaos_orders', 'tenant', shard_count => {TENANTS});
"""
SETTLE_TIMEOUT = 120.0
"""Seconds for Citus to settle the transactions left prepared on the worker nodes (generous:
its recovery runs every second, on a shared machine)."""


@pytest.fixture
def citus_nodes(chaos_template: Path) -> Iterator[tuple[Cluster, Cluster, Cluster]]:
    """A coordinator and two worker nodes, servers of the scenario's own (its faults stop
    them), with Citus preloaded."""
    require_citus()
    with contextlib.ExitStack() as stack:
        coordinator, first, second = (
            stack.enter_context(cluster_from(chaos_template, {**CITUS_SETTINGS, **SESSIONS}))
            for _ in range(3)
        )
        yield coordinator, first, second


@pytest_asyncio.fixture
async def scene(
    request: pytest.FixtureRequest,
    citus_nodes: tuple[Cluster, Cluster, Cluster],
    tmp_path: Path,
) -> AsyncIterator[Scene]:
    """The scenario's database on the Citus cluster: Cyclone's and the ledger's tables on the
    coordinator, the orders' shards on both worker nodes; its processes write orders."""
    coordinator, *workers = citus_nodes
    await form_database(coordinator.dsn, [w.dsn for w in workers], "chaos")
    name = request.node.name.removeprefix("test_")
    scene = Scene(
        name, coordinator.dsn_for("chaos"), coordinator.dsn, tmp_path, {"CHAOS_ORDERS": "1"}
    )
    await scene.prepare(create=False)
    conn = await asyncpg.connect(scene.dsn)
    try:
        await conn.execute(ORDERS)
        ports = await conn.fetch(
            "SELECT DISTINCT nodeport FROM citus_shards WHERE table_name = $1::regclass",
            "chaos_orders",
        )
    finally:
        await conn.close()
    assert {r[0] for r in ports} == {w.port for w in workers}, "orders not on both worker nodes"
    try:
        yield scene
    finally:
        await scene.reap()


async def orders_match_effects(scene: Scene, workers: list[Cluster]) -> None:
    """Wait until no transaction is left prepared on the worker nodes (Citus has committed or
    rolled back each), then check that the orders hold exactly the effects' attempts: each
    attempt that completed has one order, and no attempt that did not complete has one."""
    async with contextlib.AsyncExitStack() as stack:
        nodes = [
            await stack.enter_async_context(asyncpg.create_pool(w.dsn, min_size=1, max_size=1))
            for w in workers
        ]
        async with asyncio.timeout(SETTLE_TIMEOUT):
            while await prepared(nodes):  # noqa: ASYNC110 - Citus settles on its own timer
                await asyncio.sleep(0.5)
    conn = await asyncpg.connect(scene.dsn)
    try:
        effects = await conn.fetch("SELECT run_id, node, attempt FROM chaos_effects")
        orders = await conn.fetch("SELECT run_id, node, attempt FROM chaos_orders")
    finally:
        await conn.close()
    done = {tuple(r) for r in effects}
    ordered = [tuple(r) for r in orders]
    assert len(ordered) == len(set(ordered)), "an attempt has two orders"
    missing, stray = done - set(ordered), set(ordered) - done
    assert not missing, f"{len(missing)} completed attempts without an order: {sorted(missing)[:3]}"
    assert not stray, f"{len(stray)} orders of attempts that did not complete: {sorted(stray)[:3]}"


async def prepared(nodes: list[asyncpg.Pool]) -> int:
    """How many transactions are left prepared on these nodes."""
    return sum([await n.fetchval("SELECT count(*) FROM pg_prepared_xacts") for n in nodes])


def retried_errors(scene: Scene) -> list[str]:
    """The messages of the workers' log lines about an attempt that failed and is retried."""
    return [
        line["msg"]
        for line in scene.log_lines()
        if line.get("level") == "WARNING" and "; retrying in " in line["msg"]
    ]


async def unclear_errors(scene: Scene, messages: list[str], node: Cluster) -> list[str]:
    """The messages that name neither the stopped ``node`` nor a shard on it. Citus names the
    node when it cannot connect to it; when the node goes away under a connection it holds,
    its error at COMMIT names the shard instead ("could not commit transaction for shard
    102008 on at least one active node"), so that shard must be one of the node's."""
    conn = await asyncpg.connect(scene.dsn)
    try:
        shards = {
            r[0]
            for r in await conn.fetch(
                "SELECT shardid FROM citus_shards WHERE table_name = $1::regclass"
                " AND nodeport = $2",
                "chaos_orders",
                node.port,
            )
        }
    finally:
        await conn.close()
    named = f"connection to the remote node postgres@127.0.0.1:{node.port} failed"
    unclear = []
    for message in messages:
        shard = re.search(r"could not commit transaction for shard (\d+) ", message)
        if named not in message and not (shard and int(shard[1]) in shards):
            unclear.append(message)
    return unclear


async def test_citus_worker_node_stopped(
    scene: Scene, record_figures: Any, citus_nodes: tuple[Cluster, Cluster, Cluster]
) -> None:
    """A worker node stopped at once for FAULT seconds and started again: the completions
    that write its tenants' orders fail and are retried, the others' go on."""
    _, node, other = citus_nodes
    figures = await run(scene, record_figures, restart(node))
    assert figures.reexecuted > 0, "no completion writing to the stopped node was retried"
    assert figures.fault_ratio > 0, "no run completed while the node was away"
    messages = retried_errors(scene)
    assert any(f"127.0.0.1:{node.port}" in m for m in messages), "no error named the node"
    unclear = await unclear_errors(scene, messages, node)
    assert not unclear, f"errors about neither the stopped node nor its shards: {unclear[:5]}"
    await orders_match_effects(scene, [node, other])


async def test_citus_coordinator_restart(
    scene: Scene, record_figures: Any, citus_nodes: tuple[Cluster, Cluster, Cluster]
) -> None:
    """The coordinator stopped at once for FAULT seconds and started again: Cyclone's clients
    and workers reconnect by themselves, and Citus settles what the stop left prepared. Every
    connection is new after the restart: the nodes run with the session setting the docs
    advise, without which their type lookups alone take seconds (docs/scaling.md)."""
    coordinator, *workers = citus_nodes
    figures = await run(scene, record_figures, restart(coordinator))
    assert figures.reexecuted > 0, "no attempt was cut off by the stop"
    await orders_match_effects(scene, workers)
