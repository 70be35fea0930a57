"""The schema check: a client or worker on a schema that is not this package's says so once."""

from __future__ import annotations

import asyncio

import pytest

import cyclone
from cyclone._storage.loader import MIGRATIONS
from cyclone.testing.plugin import TEST_WORKER_OPTIONS, CycloneEnv
from tests.conftest import Records, one_migration_behind


@cyclone.step("schema_check.echo", queue="schema_check")
async def echo(ctx: cyclone.Context, n: int) -> int:
    return n


async def test_a_migrated_schema_passes(cyclone_env: CycloneEnv) -> None:
    await cyclone_env.client.check_schema()


async def test_an_unmigrated_schema(cyclone_env: CycloneEnv) -> None:
    client = cyclone.Client(cyclone_env.pool, schema="nothing_here")
    with pytest.raises(cyclone.SchemaNotMigratedError) as caught:
        await client.check_schema()
    assert str(caught.value) == (
        "schema 'nothing_here' has no Cyclone tables: run `cyclone migrate` "
        "(or `await client.migrate()`)"
    )
    assert caught.value.missing == [m.version for m in client._queries.migrations]
    assert isinstance(caught.value, cyclone.CycloneError)


async def test_a_partly_migrated_schema(cyclone_env: CycloneEnv) -> None:
    client = cyclone.Client(cyclone_env.pool, schema="older")
    latest = client._queries.migrations
    client._queries.migrations = latest[:2]  # as an install of the version before 0003
    await client.migrate()
    client._queries.migrations = latest
    with pytest.raises(cyclone.SchemaNotMigratedError) as caught:
        await client.check_schema()
    missing = ", ".join(str(m.version) for m in latest[2:])
    assert str(caught.value) == (
        f"schema 'older' lacks Cyclone migrations {missing}: run `cyclone migrate` "
        "(or `await client.migrate()`)"
    )
    await client.migrate()
    await client.check_schema()


async def test_a_schema_newer_than_the_code(cyclone_env: CycloneEnv) -> None:
    client = cyclone.Client(cyclone_env.pool, schema="newer")
    await client.migrate()
    await cyclone_env.pool.execute(
        "INSERT INTO newer.cyclone_migrations (version, name) VALUES (9999, 'from_the_future')"
    )
    with pytest.raises(cyclone.SchemaVersionError) as caught:
        await client.check_schema()
    assert str(caught.value) == (
        "schema 'newer' has Cyclone migrations 9999, newer than this version of cyclone-pg "
        f"knows (up to {client._queries.migrations[-1].version}): upgrade cyclone-pg on this host"
    )
    # Waiting cannot mend it: even a worker told to wait refuses at once.
    worker = cyclone.Worker(client, steps=[echo], wait_for_schema=True, **TEST_WORKER_OPTIONS)
    with pytest.raises(cyclone.SchemaVersionError):
        await asyncio.wait_for(worker.start(), 60)


async def test_a_worker_refuses_an_unmigrated_schema(cyclone_env: CycloneEnv) -> None:
    client = cyclone.Client(cyclone_env.pool, schema="not_yet")
    with pytest.raises(cyclone.SchemaNotMigratedError, match="run `cyclone migrate`"):
        async with cyclone.Worker(client, steps=[echo], **TEST_WORKER_OPTIONS):
            pytest.fail("the worker started on an unmigrated schema")


async def test_a_worker_waits_for_migrations(cyclone_env: CycloneEnv, records: Records) -> None:
    client = cyclone.Client(cyclone_env.pool, schema="migrated_later")
    worker = cyclone.Worker(client, steps=[echo], wait_for_schema=True, **TEST_WORKER_OPTIONS)
    starting = asyncio.get_running_loop().create_task(worker.start())
    await records.wait_for("waiting for migrations")
    assert not starting.done()
    await client.migrate()
    await asyncio.wait_for(starting, 60)
    try:
        run = await echo.enqueue(client, 7)
        assert await run.result(timeout=60) == 7
    finally:
        await worker.stop()
    assert records.messages("waiting for migrations") == [
        "waiting for migrations: schema 'migrated_later' has no Cyclone tables: run "
        "`cyclone migrate` (or `await client.migrate()`); checking again until they are applied"
    ]


async def test_pending_migrations_lists_what_the_schema_lacks(cyclone_env: CycloneEnv) -> None:
    """The public operations a deploy script uses: what is pending, apply, then nothing."""
    client = cyclone.Client(cyclone_env.pool, schema="ops_behind")
    await one_migration_behind(cyclone_env, "ops_behind")
    last = MIGRATIONS[-1].version
    assert await client.pending_migrations() == [last]
    assert await client.migrate() == [last]
    assert await client.pending_migrations() == []
    await client.wait_until_ready()  # migrated, reachable: returns at once


async def test_wait_until_ready_waits_for_the_schema_when_asked(cyclone_env: CycloneEnv) -> None:
    client = cyclone.Client(cyclone_env.pool, schema="ops_later")
    with pytest.raises(cyclone.SchemaNotMigratedError):
        await client.wait_until_ready()
    waiting = asyncio.ensure_future(client.wait_until_ready(wait_for_schema=True))
    await asyncio.sleep(0.2)  # it is waiting (nothing to await: the wait is the subject)
    assert not waiting.done()
    await client.migrate()
    await asyncio.wait_for(waiting, 60)


async def test_purge_reports_each_batch(cyclone_env: CycloneEnv) -> None:
    client = cyclone_env.client
    await echo.enqueue_many(client, list(range(3)))
    await cyclone_env.drain(steps=[echo])
    batches: list[int] = []
    assert await client.purge_terminal_runs(0, on_batch=batches.append) == 3
    assert sum(batches) == 3
    with pytest.raises(cyclone.InvalidInputError, match="on_batch must be a callable"):
        await client.purge_terminal_runs(0, on_batch=3)  # type: ignore[arg-type]
