"""Databases on a Citus cluster for the tests (:mod:`cyclone.testing._citus` starts it).

Each test's database is made on every node from a template: the coordinator's with the
``citus`` extension, both workers registered and Cyclone migrated, the workers' with the
extension. Citus reaches a worker's database of the same name, so a database cloned on all
three nodes is a cluster of its own at once, without registering anything again.
"""

from __future__ import annotations

import asyncio
import itertools
import os
from urllib.parse import urlsplit

import asyncpg
import pytest

from cyclone import Client
from cyclone.testing._citus import CitusCluster, citus_missing, execute, form_database
from cyclone.testing.plugin import DatabaseFactory

INSTALL = "../shared/citus/install.sh"
_counter = itertools.count()
_DROP_TRIES = 5
SESSIONS = {"citus.override_table_visibility": "off"}
"""What the tests' cluster sets for every session, as docs/scaling.md advises for Cyclone's
pools: asyncpg's lookup of an array type (once per connection and type) takes about 0.2 s
while Citus hides its shards from catalog queries, and 10 ms without."""


def require_citus() -> None:
    """Skip the calling test where Citus is not installed, except in CI (``CI`` set), where
    that fails: CI installs it."""
    missing = citus_missing()
    if missing is None:
        return
    why = f"{missing} ({INSTALL} does it on these machines)"
    if os.environ.get("CI"):
        pytest.fail(why)
    pytest.skip(why)


def prepared_on(sent: list[str]) -> int:
    """How many nodes a transaction was prepared on (its first phase), from the commands
    Citus logged sending them (``citus.log_remote_commands``)."""
    return sum("PREPARE TRANSACTION" in line for line in sent)


class CitusDatabases(DatabaseFactory):
    """:class:`cyclone.testing.plugin.DatabaseFactory` on a Citus cluster: each database is
    made on every node, cloned from a template with the ``citus`` extension (and, on the
    coordinator, the workers registered and Cyclone migrated)."""

    def __init__(self, cluster: CitusCluster) -> None:
        super().__init__(cluster.coordinator)
        self.cluster = cluster

    async def create_template(self) -> None:
        coordinator, workers = self.cluster.coordinator, self.cluster.workers
        await form_database(coordinator.dsn, [w.dsn for w in workers], self.template)
        pool = await asyncpg.create_pool(coordinator.dsn_for(self.template), min_size=1, max_size=2)
        try:
            await Client(pool).migrate()
        finally:
            await pool.close()
        # Citus keeps sessions of its own in a database (its maintenance daemon, cached
        # connections between nodes), and a database with sessions cannot be cloned.
        for node in self.cluster.nodes:
            await execute(node.dsn, f'ALTER DATABASE "{self.template}" ALLOW_CONNECTIONS false')
            await execute(
                node.dsn,
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE datname = $1 AND pid <> pg_backend_pid()",
                self.template,
            )

    async def drop_template(self) -> None:
        await self._drop(self.template)

    async def create(self) -> str:
        name = f"{self.template.removesuffix('_template')}_{next(_counter)}"
        await asyncio.gather(
            *(
                execute(node.dsn, f'CREATE DATABASE "{name}" TEMPLATE "{self.template}"')
                for node in self.cluster.nodes
            )
        )
        return self.cluster.coordinator.dsn_for(name)

    async def drop(self, dsn: str) -> None:
        await self._drop(urlsplit(dsn).path.lstrip("/"))

    async def _drop(self, name: str) -> None:
        await asyncio.gather(*(_drop_on(node.dsn, name) for node in self.cluster.nodes))


async def _drop_on(dsn: str, name: str) -> None:
    """Drop database ``name`` on one node. It is closed to new sessions first, and the drop
    is tried again while a session still holds it: Citus's maintenance daemon for a database
    made moments ago may be starting, and outlive the 5 s ``FORCE`` gives sessions to end."""
    await execute(dsn, f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS false')
    for attempt in range(1, _DROP_TRIES + 1):
        try:
            await execute(dsn, f'DROP DATABASE "{name}" WITH (FORCE)')
            return
        except asyncpg.ObjectInUseError:
            if attempt == _DROP_TRIES:
                raise
