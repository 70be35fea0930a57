"""A migration that builds an index concurrently (first line ``-- apply: concurrently``):
applied outside the migrating transaction, so that claims and enqueues go on while the index
waits for a long transaction on its table; a build left invalid is built again; many
migrators at once apply it once."""

from __future__ import annotations

import asyncio

import asyncpg
import pytest

import cyclone
from cyclone._storage.loader import MIGRATIONS, Migration, SqlLoadError, parse_migration
from cyclone.testing.plugin import CycloneEnv
from tests.conftest import fast_worker, waiting_on_a_lock

BUILD = """-- apply: concurrently
-- An index on the tasks table, which can be large.
CREATE INDEX CONCURRENTLY IF NOT EXISTS idx_tasks_test_kind
    ON __schema__.cyclone_tasks (kind, id);
"""
AFTER = "ALTER TABLE __schema__.cyclone_workers ADD COLUMN test_after integer;"
NEXT = MIGRATIONS[-1].version + 1


@cyclone.step("concurrently.echo", queue="concurrently")
async def echo(ctx: cyclone.Context, n: int) -> int:
    return n


def with_build(client: cyclone.Client) -> None:
    """The client's migrations, then the index build, then a plain migration after it."""
    q = client._queries
    q.migrations = (
        *q.migrations,
        q.migration(parse_migration(NEXT, "test_index", BUILD)),
        q.migration(Migration(NEXT + 1, "test_after", AFTER)),
    )


async def index_valid(env: CycloneEnv, schema: str) -> bool | None:
    valid: bool | None = await env.pool.fetchval(
        "SELECT i.indisvalid FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid"
        " JOIN pg_namespace n ON n.oid = c.relnamespace"
        " WHERE n.nspname = $1 AND c.relname = 'idx_tasks_test_kind'",
        schema,
    )
    return valid


async def test_claims_and_enqueues_go_on_while_the_index_waits(cyclone_env: CycloneEnv) -> None:
    """A long transaction has written to the tasks table: the build waits for it, and all
    the while a job is enqueued, claimed and completed (inside one transaction, the build
    would be refused; as a plain CREATE INDEX, it would hold every enqueue back)."""
    schema = "building"
    client = cyclone.Client(cyclone_env.pool, schema=schema, notify=False)
    await client.migrate()
    app = cyclone.Client(cyclone_env.pool, schema=schema, notify=False)  # the running release
    with_build(client)
    await echo.enqueue(app, 0)
    async with cyclone_env.pool.acquire() as long_tx, long_tx.transaction():
        await long_tx.execute(f"UPDATE {schema}.cyclone_tasks SET priority = priority")
        migrating = asyncio.get_running_loop().create_task(client.migrate())
        await waiting_on_a_lock(cyclone_env)  # the build waits for the long transaction
        async with fast_worker(app, steps=[echo]):
            run = await echo.enqueue(app, 1)
            assert await run.result(timeout=60) == 1
        assert not migrating.done()
        assert await index_valid(cyclone_env, schema) is False  # built, not yet valid
    assert await asyncio.wait_for(migrating, 60) == [NEXT, NEXT + 1]
    assert await index_valid(cyclone_env, schema) is True
    assert await client.migrate() == []


async def test_an_index_a_failed_build_left_invalid_is_built_again(
    cyclone_env: CycloneEnv,
) -> None:
    """The build is cancelled while it waits: the index stays invalid and the migration
    unrecorded; the next migrate drops that index and builds it again."""
    schema = "rebuilt"
    client = cyclone.Client(cyclone_env.pool, schema=schema, notify=False)
    await client.migrate()
    with_build(client)
    async with cyclone_env.pool.acquire() as long_tx:
        tx = long_tx.transaction()
        await tx.start()
        await long_tx.execute(f"UPDATE {schema}.cyclone_tasks SET priority = priority")
        migrating = asyncio.get_running_loop().create_task(client.migrate())
        await waiting_on_a_lock(cyclone_env)
        await cyclone_env.pool.execute(
            "SELECT pg_cancel_backend(pid) FROM pg_stat_activity"
            " WHERE query LIKE 'CREATE INDEX CONCURRENTLY%'"
        )
        with pytest.raises(asyncpg.QueryCanceledError):
            await asyncio.wait_for(migrating, 60)
        await tx.rollback()
    assert await index_valid(cyclone_env, schema) is False
    assert NEXT not in await client.pool.fetchval(
        f"SELECT array_agg(version) FROM {schema}.cyclone_migrations"
    )
    assert await client.migrate() == [NEXT, NEXT + 1]
    assert await index_valid(cyclone_env, schema) is True


async def test_many_migrators_apply_it_once(cyclone_env: CycloneEnv) -> None:
    pools = [await asyncpg.create_pool(cyclone_env.dsn, min_size=1, max_size=2) for _ in range(4)]
    try:
        clients = [cyclone.Client(p, schema="together", notify=False) for p in pools]
        for client in clients:
            with_build(client)
        applied = await asyncio.wait_for(asyncio.gather(*(c.migrate() for c in clients)), 120)
    finally:
        for pool in pools:
            await pool.close()
    every = [m.version for m in MIGRATIONS] + [NEXT, NEXT + 1]
    assert sorted(v for a in applied for v in a) == every  # each version once, in all
    assert await index_valid(cyclone_env, "together") is True


def test_a_concurrent_migration_holds_only_index_builds() -> None:
    built = parse_migration(NEXT, "ok", BUILD + "DROP INDEX CONCURRENTLY IF EXISTS __schema__.x;")
    assert [b.index for b in built.builds] == ["idx_tasks_test_kind", None]
    with pytest.raises(SqlLoadError, match="only builds or drops indexes"):
        parse_migration(NEXT, "bad", BUILD + AFTER)
    with pytest.raises(SqlLoadError, match="only builds or drops indexes"):  # not idempotent
        parse_migration(
            NEXT, "bad", "-- apply: concurrently\nCREATE INDEX CONCURRENTLY i ON t (a);"
        )
    assert parse_migration(NEXT, "plain", AFTER).builds == ()
