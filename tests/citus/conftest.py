"""A fresh database on the session's Citus cluster per test (``citus_databases``, in the
tests' conftest), with a pool and a migrated client."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest_asyncio

from cyclone.testing.plugin import CycloneEnv
from tests.citus.cluster import CitusDatabases


@pytest_asyncio.fixture
async def citus_env(citus_databases: CitusDatabases) -> AsyncIterator[CycloneEnv]:
    async with citus_databases.env() as env:
        yield env
