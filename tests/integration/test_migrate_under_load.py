"""Migrating a schema in use: a migration's statement that waits for a table's lock gives way
after a moment (``lock_timeout``) rather than queue every claim, enqueue and heartbeat on
that table behind it, and migrate tries again until it goes through."""

from __future__ import annotations

import asyncio

import cyclone
from cyclone._storage.loader import Queries
from cyclone.testing.plugin import CycloneEnv
from tests.conftest import Records, one_migration_behind, waiting_on_a_lock


async def test_a_migration_waiting_for_a_lock_lets_the_others_through(
    cyclone_env: CycloneEnv, records: Records
) -> None:
    """The last migration alters cyclone_tasks while a long transaction reads it. An enqueue's
    insert into that table, behind the migration's lock request, goes through while the long
    transaction still runs; the migration is applied once it ends."""
    schema = "under_load"
    await one_migration_behind(cyclone_env, schema)
    client = cyclone.Client(cyclone_env.pool, schema=schema, notify=False)
    async with cyclone_env.pool.acquire() as long_tx, long_tx.transaction():
        await long_tx.fetch(f"SELECT * FROM {schema}.cyclone_tasks")  # holds ACCESS SHARE
        migrating = asyncio.get_running_loop().create_task(client.migrate())
        await waiting_on_a_lock(cyclone_env)  # the ALTER waits behind the long transaction
        # An enqueue's write to the table: without the lock timeout, it would queue behind
        # the ALTER, which queues behind the long transaction, for as long as that lasts.
        async with cyclone_env.pool.acquire() as enqueue:
            await asyncio.wait_for(
                enqueue.execute(
                    f"INSERT INTO {schema}.cyclone_tasks (run_id, kind, queue, max_attempts)"
                    " VALUES (gen_random_uuid(), 'k', 'q', 1)"
                ),
                30,
            )
        await records.wait_for("rolled back, trying again")
        assert not migrating.done()
    applied = await asyncio.wait_for(migrating, 60)
    assert applied == [Queries(schema).migrations[-1].version]
    await client.aclose()
