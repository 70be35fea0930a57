"""A synchronous producer process and an asyncio worker process: 1,000 jobs, none lost."""

from __future__ import annotations

import asyncio
import sys

from cyclone.testing.plugin import CycloneEnv
from tests.conftest import ROOT, reaped

JOBS = 1000


async def test_a_sync_producer_and_an_async_worker_complete_every_job(
    cyclone_env: CycloneEnv,
) -> None:
    await cyclone_env.pool.execute("CREATE TABLE public.done (n int PRIMARY KEY)")
    module = "tests.frameworks.processes"
    worker = await asyncio.create_subprocess_exec(
        sys.executable, "-m", module, "work", cyclone_env.dsn, cwd=ROOT
    )
    async with reaped(worker):
        producer = await asyncio.create_subprocess_exec(
            sys.executable, "-m", module, "produce", cyclone_env.dsn, str(JOBS), cwd=ROOT
        )
        async with reaped(producer):
            assert await asyncio.wait_for(producer.wait(), 120) == 0
        async with asyncio.timeout(120):
            while await cyclone_env.pool.fetchval("SELECT count(*) FROM public.done") < JOBS:  # noqa: ASYNC110 - another process's progress
                await asyncio.sleep(0.1)
    done = [r["n"] for r in await cyclone_env.pool.fetch("SELECT n FROM public.done ORDER BY n")]
    assert done == list(range(JOBS))  # each exactly once (primary key), none missing
    states = await cyclone_env.pool.fetch(
        "SELECT state, count(*) FROM public.cyclone_runs GROUP BY state"
    )
    assert {r["state"]: r["count"] for r in states} == {"completed": JOBS}


def test_an_asyncio_client_in_a_second_event_loop_gets_a_clear_error(
    cyclone_env: CycloneEnv,
) -> None:
    import asyncpg
    import pytest

    import cyclone
    from tests.frameworks.conftest import Order, ship

    async def make() -> tuple[asyncpg.Pool, cyclone.Client]:
        pool = await asyncpg.create_pool(cyclone_env.dsn, min_size=1, max_size=2)
        return pool, cyclone.Client(pool)

    first = asyncio.new_event_loop()
    try:
        pool, client = first.run_until_complete(make())
        with pytest.raises(cyclone.InvalidStateError, match="belongs to another event loop"):
            asyncio.run(ship.enqueue(client, Order("second loop")))
        first.run_until_complete(pool.close())
    finally:
        first.close()
