"""Databases on a Citus cluster for the tests (:mod:`cyclone.testing._citus` starts it).

Each test's database is made on every node from a template: the coordinator's with the
``citus`` extension, both workers registered and Cyclone migrated, the workers' with the
extension. Citus reaches a worker's database of the same name, so a database cloned on all
three nodes is a cluster of its own at once, without registering anything again.
"""

from __future__ import annotations

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
        for node in self.cluster.nodes:
            await execute(node.dsn, f'CREATE DATABASE "{name}" TEMPLATE "{self.template}"')
        return self.cluster.coordinator.dsn_for(name)

    async def drop(self, dsn: str) -> None:
        await self._drop(urlsplit(dsn).path.lstrip("/"))

    async def _drop(self, name: str) -> None:
        # Closed to new sessions first: Citus's own would come back between FORCE's end of
        # the old ones and the drop.
        for node in self.cluster.nodes:
            await execute(node.dsn, f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS false')
            await execute(node.dsn, f'DROP DATABASE "{name}" WITH (FORCE)')
