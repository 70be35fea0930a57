"""A worker process for the stream kill test: ``python -m tests.e2e.stream_app DSN LEASE``.

Its step streams ``n`` items an attempt (attempt 1: values 0 to n-1, attempt 2: n to 2n-1)
and reports its progress. Attempt 1 then says so (a NOTIFY on ``e2e_streamed``) and hangs
until the process is killed; attempt 2 returns.
"""

from __future__ import annotations

import asyncio
import sys

import asyncpg

import cyclone


@cyclone.step("e2e.produce", queue="e2e-streams", max_attempts=3)
async def produce(ctx: cyclone.Context, n: int) -> int:
    first = 0 if ctx.attempt == 1 else n
    for i in range(first, first + n):
        await ctx.stream({"i": i})
    await ctx.report({"done": first + n, "total": 2 * n})
    if ctx.attempt == 1:
        await ctx.client.pool.execute("SELECT pg_notify('e2e_streamed', $1)", str(n))
        await asyncio.sleep(3600)  # killed here, its items durable already
    return 2 * n


async def main(dsn: str, lease: float) -> None:
    async with asyncpg.create_pool(dsn, min_size=1, max_size=4) as pool:
        client = cyclone.Client(pool)
        worker = cyclone.Worker(
            client, steps=[produce], poll_interval=0.1, lease=lease, maintenance_interval=0.2
        )
        async with worker:
            await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], float(sys.argv[2])))
