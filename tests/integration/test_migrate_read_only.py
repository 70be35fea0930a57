"""``migrate()`` on a server that takes no writes says to run it against the primary."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import asyncpg
import pytest

import cyclone
from cyclone.testing.plugin import CycloneEnv
from tests.chaos.cluster import cluster_from, require_server_binaries, template_data
from tests.cli.process import cli, one_line_error

require_server_binaries()

MESSAGE = (
    "migrating schema 'fresh': connected to a read-only server (a standby?): run migrations "
    "against the primary; with a multi-host DSN add target_session_attrs=read-write"
)


async def _schemas(conn: asyncpg.Pool | asyncpg.pool.PoolConnectionProxy) -> list[str]:
    rows = await conn.fetch("SELECT nspname FROM pg_namespace WHERE nspname = 'fresh'")
    return [r["nspname"] for r in rows]


async def test_a_read_only_session(cyclone_env: CycloneEnv) -> None:
    pool = await asyncpg.create_pool(
        cyclone_env.dsn,
        min_size=1,
        max_size=2,
        server_settings={"default_transaction_read_only": "on"},
    )
    try:
        with pytest.raises(cyclone.ReadOnlyServerError) as caught:
            await cyclone.Client(pool, schema="fresh").migrate()
    finally:
        await pool.close()
    assert str(caught.value) == MESSAGE
    assert isinstance(caught.value.__cause__, asyncpg.ReadOnlySQLTransactionError)
    assert await _schemas(cyclone_env.pool) == []  # nothing was written


async def test_a_read_only_database_through_the_cli(cyclone_env: CycloneEnv) -> None:
    database = cyclone_env.dsn.rsplit("/", 1)[1]
    await cyclone_env.pool.execute(
        f'ALTER DATABASE "{database}" SET default_transaction_read_only = on'
    )
    try:
        code, _, err = await cli("--schema", "fresh", "migrate", dsn=cyclone_env.dsn)
    finally:
        await cyclone_env.pool.execute(
            f'ALTER DATABASE "{database}" RESET default_transaction_read_only'
        )
    assert one_line_error(code, err) == f"cyclone: {MESSAGE}"


@pytest.fixture(scope="module")
def template() -> Iterator[Path]:
    with template_data() as data:
        yield data


@pytest.mark.plain_only("starts a primary and a hot standby of its own, not on Citus")
async def test_a_hot_standby(template: Path) -> None:
    with cluster_from(template) as primary:
        standby = await asyncio.to_thread(primary.standby, "standby")
        await asyncio.to_thread(standby.start)
        pool = await asyncpg.create_pool(standby.dsn, min_size=1, max_size=2)
        try:
            assert await pool.fetchval("SELECT pg_is_in_recovery()")
            with pytest.raises(cyclone.ReadOnlyServerError) as caught:
                await cyclone.Client(pool, schema="fresh").migrate()
            assert str(caught.value) == MESSAGE
            async with pool.acquire() as conn:
                assert await _schemas(conn) == []
        finally:
            await pool.close()
