"""Cyclone on a Citus cluster says where its tables are, and refuses at once a layout it
cannot run on: its tables in Citus's metadata (distributed or reference tables), or a worker
node reached instead of the coordinator."""

from __future__ import annotations

import asyncio
import logging
import signal

import asyncpg
import pytest

import cyclone
from cyclone.testing.plugin import CycloneEnv
from tests.citus.cluster import CitusDatabases
from tests.cli.app import echo
from tests.cli.process import cli, line_with, one_line_error, start
from tests.conftest import reaped

LOCAL = "coordinator, Cyclone's tables local"


async def test_migrate_and_the_worker_say_citus(citus_env: CycloneEnv) -> None:
    code, out, _ = await cli("--schema", "other", "migrate", dsn=citus_env.dsn)
    assert code == 0, out
    assert "schema other is up to date" in out and "on Citus 13" in out and LOCAL in out
    # The new schema's table that marks transactions for two phases is local to the
    # coordinator in Citus's metadata; no other of Cyclone's tables is in it.
    tables = await citus_env.pool.fetch(
        "SELECT logicalrelid::text AS name, partmethod::text || repmodel::text AS how"
        " FROM pg_dist_partition WHERE logicalrelid::text LIKE 'other.%'"
    )
    assert [tuple(t) for t in tables] == [("other.cyclone_two_phase", "ns")]
    worker = await start("worker", "tests.cli.app:WORK", dsn=citus_env.dsn)
    async with reaped(worker):
        line = await line_with(worker, "running")
        assert "(Citus 13" in line and LOCAL in line, line
        run = await echo.enqueue(citus_env.client, 21)
        assert await run.result(timeout=60) == 21
        worker.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(worker.wait(), 60) == 0


async def test_a_cyclone_table_made_a_citus_table_is_refused_at_once(
    citus_env: CycloneEnv,
) -> None:
    await citus_env.pool.execute("SELECT create_reference_table('cyclone_workers')")
    said = r"cyclone_workers \(a reference table\).*undistribute_table\('public.cyclone_workers'\)"
    client = cyclone.Client(citus_env.pool, notify=False)
    with pytest.raises(cyclone.UnsupportedLayoutError, match=said):
        await client.check_schema()
    fresh = cyclone.Client(citus_env.pool, notify=False)  # a producer that checks nothing
    async with citus_env.pool.acquire() as conn:
        with pytest.raises(cyclone.UnsupportedLayoutError, match=said):
            async with conn.transaction():
                await echo.enqueue_tx(fresh, conn, 1)
    assert await citus_env.pool.fetchval("SELECT count(*) FROM cyclone_runs") == 0
    code, _, err = await cli("migrate", dsn=citus_env.dsn)
    assert "undistribute_table" in one_line_error(code, err)
    code, _, err = await cli("worker", "tests.cli.app:WORK", dsn=citus_env.dsn)
    assert "cyclone_workers (a reference table)" in one_line_error(code, err)


async def test_a_worker_node_is_refused(
    citus_env: CycloneEnv, citus_databases: CitusDatabases
) -> None:
    database = citus_env.dsn.rsplit("/", 1)[1]
    node = citus_databases.cluster.workers[0].dsn_for(database)
    async with asyncpg.create_pool(node, min_size=1, max_size=2) as pool:
        with pytest.raises(cyclone.UnsupportedLayoutError, match=r"connect .* to the coordinator"):
            await cyclone.Client(pool, notify=False).migrate()
        assert await pool.fetchval("SELECT to_regclass('cyclone_runs')") is None  # rolled back


async def test_a_pool_that_hides_shards_is_warned_about(
    citus_env: CycloneEnv, caplog: pytest.LogCaptureFixture
) -> None:
    """Citus's default hides shards from catalog queries, which makes each new connection's
    type lookups slow: a worker's start says so, with the setting that fixes it (the tests'
    cluster has it)."""
    hiding = {"citus.override_table_visibility": "on"}
    async with asyncpg.create_pool(citus_env.dsn, server_settings=hiding) as pool:
        with caplog.at_level(logging.WARNING, logger="cyclone"):
            await cyclone.Client(pool, notify=False).check_schema()
    [warning] = [
        r.getMessage() for r in caplog.records if "override_table_visibility" in r.getMessage()
    ]
    assert "server_settings={'citus.override_table_visibility': 'off'}" in warning
    caplog.clear()
    async with asyncpg.create_pool(citus_env.dsn) as pool:  # the cluster's setting: off
        with caplog.at_level(logging.WARNING, logger="cyclone"):
            await cyclone.Client(pool, notify=False).check_schema()
    assert not [r for r in caplog.records if "override_table_visibility" in r.getMessage()]
