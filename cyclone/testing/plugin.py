"""The pytest plugin: a real, throwaway PostgreSQL and an isolated database per test.

Fixtures:

- ``cyclone_server`` (session): the :class:`PostgresServer` (see ``postgres_server`` for where
  it comes from; a line after the test results names the source it used).
- ``cyclone_databases`` (session): a :class:`DatabaseFactory` that clones fresh databases from
  a template migrated once per session.
- ``cyclone_env`` (function): a :class:`CycloneEnv` with its own database, pool and client;
  ``env.worker(steps=...)`` makes a worker with short test intervals and
  ``await env.drain(steps=...)`` runs one until no claimable work is left.
- ``cyclone_worker`` (function): ``await cyclone_worker(steps=[...])`` starts a worker that is
  stopped after the test.

Each test's database is its own, so tests are isolated and can run in parallel (pytest-xdist
workers each get their own template).

pytest loads this plugin in every session of an environment where cyclone-pg is installed, so
it asks nothing of a project that does not use it: it loads without pytest-asyncio, prints
nothing, and starts no server until a test asks for one of its fixtures. Without
pytest-asyncio, ``cyclone_env`` and ``cyclone_worker`` fail the test that uses them with the
command that installs it.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

import asyncpg
import pytest

from cyclone._client import Client
from cyclone._model.steps import Step
from cyclone._model.workflows import Workflow
from cyclone._worker.worker import Worker
from cyclone.testing._postgres import PostgresServer, describe, postgres_server, server_version

try:
    import pytest_asyncio
except ModuleNotFoundError as exc:
    # Only pytest-asyncio itself may be missing: a failure inside it is re-raised as it is.
    if exc.name != "pytest_asyncio":
        raise
    _HAVE_PYTEST_ASYNCIO = False
else:
    _HAVE_PYTEST_ASYNCIO = True

_counter = itertools.count()
_SERVER_USED = pytest.StashKey[str]()
INSTALL_TESTING = "pip install 'cyclone-pg[testing]'"
"""The command that installs what the plugin's asyncio fixtures need."""


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
        # Recorded before the version is asked, so that the summary names the source even if
        # that question fails.
        request.config.stash[_SERVER_USED] = describe(server)
        request.config.stash[_SERVER_USED] = describe(server, version=server_version(server))
        yield server


@pytest.fixture(scope="session")
def cyclone_databases(cyclone_server: PostgresServer) -> Iterator[DatabaseFactory]:
    """Creates isolated, migrated databases on the session's server."""
    factory = DatabaseFactory(cyclone_server)
    asyncio.run(factory.create_template())
    yield factory
    asyncio.run(factory.drop_template())  # a server of the user's keeps no leftovers


if _HAVE_PYTEST_ASYNCIO:

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

else:
    # Registered all the same, so that a test asking for one learns what to install instead
    # of reading "fixture 'cyclone_env' not found". Neither starts a server.

    @pytest.fixture
    def cyclone_env() -> NoReturn:
        """Needs pytest-asyncio, which is not installed; the test fails saying how to get it."""
        _needs_pytest_asyncio("cyclone_env")

    @pytest.fixture
    def cyclone_worker() -> NoReturn:
        """Needs pytest-asyncio, which is not installed; the test fails saying how to get it."""
        _needs_pytest_asyncio("cyclone_worker")


def _needs_pytest_asyncio(fixture: str) -> NoReturn:
    pytest.fail(
        f"{fixture} is an asyncio fixture and needs pytest-asyncio, which is not installed:"
        f" {INSTALL_TESTING}",
        pytrace=False,
    )


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    """Say which PostgreSQL the session used, when a test started (or reached) one."""
    used = config.stash.get(_SERVER_USED, None)
    if used is not None:
        terminalreporter.write_line(f"cyclone: tests ran on {used}")


def pytest_report_header(config: pytest.Config) -> str | None:
    """Name the server ``CYCLONE_TEST_DSN`` points at; say nothing otherwise.

    Without that variable, the source is chosen when the first test needs a server, if one
    ever does, and the terminal summary names it; a session that uses no fixture of this
    plugin gets no line at all.
    """
    dsn = os.environ.get("CYCLONE_TEST_DSN")
    if dsn:
        return "cyclone: " + describe(PostgresServer(dsn, "CYCLONE_TEST_DSN"))
    return None
