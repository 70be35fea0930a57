"""Worker processes for the flow-control tests, and what they record."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable

from cyclone.testing.plugin import CycloneEnv
from tests.conftest import python_module


async def until(
    condition: Callable[[], Awaitable[bool]], timeout: float = 120.0, every: float = 0.05
) -> None:
    """Poll ``condition`` (a state of another process's making, which no event announces)
    until it is true; fail after ``timeout``."""
    async with asyncio.timeout(timeout):
        while True:
            if await condition():
                return
            await asyncio.sleep(every)


@contextlib.asynccontextmanager
async def worker_processes(
    env: CycloneEnv, n: int
) -> AsyncIterator[list[asyncio.subprocess.Process]]:
    """``n`` worker processes of tests/flow/flow_app.py, live (present) before this yields;
    killed and reaped on the way out."""
    procs = [await python_module("tests.flow.flow_app", env.dsn) for _ in range(n)]
    try:

        async def present() -> bool:
            count: int = await env.pool.fetchval(
                "SELECT count(*) FROM cyclone_workers WHERE 'flow' = ANY (queues)"
            )
            return count >= n

        await until(present)
        yield procs
    finally:
        for proc in procs:
            if proc.returncode is None:
                proc.kill()
        for proc in procs:
            await proc.wait()


async def make_starts_table(env: CycloneEnv) -> None:
    await env.pool.execute(
        "CREATE TABLE flow_starts (n serial, run_id uuid, tenant text, at timestamptz,"
        " claimed_at timestamptz)"
    )
