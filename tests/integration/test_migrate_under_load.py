"""Migrating a schema in use: a migration's statement that waits for a table's lock gives way
after a moment (``lock_timeout``) rather than queue every claim, enqueue and heartbeat on
that table behind it, and migrate tries again until it goes through."""

from __future__ import annotations

import asyncio
import re

import cyclone
from cyclone._storage.loader import Queries
from cyclone.testing.plugin import CycloneEnv
from tests.conftest import Records, one_migration_behind, waiting_on_a_lock

# A write of each table a migration may alter, as the library's own statements make them.
WRITES = {
    "cyclone_tasks": "INSERT INTO {schema}.cyclone_tasks (run_id, kind, queue, max_attempts)"
    " VALUES (gen_random_uuid(), 'k', 'q', 1)",
    "cyclone_runs": "INSERT INTO {schema}.cyclone_runs (id, name, job, input, nodes, remaining)"
    " VALUES (gen_random_uuid(), 'k', true, '1', 1, 1)",
    "cyclone_workers": "INSERT INTO {schema}.cyclone_workers"
    " (id, host, pid, queues, kinds, workflows, expires_at)"
    " VALUES ('w', 'h', 1, '{{}}', '{{}}', '{{}}', now())",
}


async def test_a_migration_waiting_for_a_lock_lets_the_others_through(
    cyclone_env: CycloneEnv, records: Records
) -> None:
    """The last migration alters a table while a long transaction reads it. A write of that
    table, behind the migration's lock request, goes through while the long transaction still
    runs; the migration is applied once it ends."""
    schema = "under_load"
    last = Queries(schema).migrations[-1]
    altered = re.search(r"ALTER TABLE \S+\.(cyclone_\w+)", last.sql)
    assert altered and altered[1] in WRITES, f"give WRITES a write of the table {last.name} alters"
    table = altered[1]
    await one_migration_behind(cyclone_env, schema)
    client = cyclone.Client(cyclone_env.pool, schema=schema, notify=False)
    async with cyclone_env.pool.acquire() as long_tx, long_tx.transaction():
        await long_tx.fetch(f"SELECT * FROM {schema}.{table}")  # holds ACCESS SHARE
        migrating = asyncio.get_running_loop().create_task(client.migrate())
        await waiting_on_a_lock(cyclone_env)  # the ALTER waits behind the long transaction
        # A write to the table: without the lock timeout, it would queue behind the ALTER,
        # which queues behind the long transaction, for as long as that lasts.
        async with cyclone_env.pool.acquire() as write:
            await asyncio.wait_for(write.execute(WRITES[table].format(schema=schema)), 30)
        await records.wait_for("rolled back, trying again")
        assert not migrating.done()
    applied = await asyncio.wait_for(migrating, 60)
    assert applied == [Queries(schema).migrations[-1].version]
    await client.aclose()
