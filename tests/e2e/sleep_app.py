"""A worker process for the sleep-node kill test: ``python -m tests.e2e.sleep_app DSN``.

It serves ``e2e.sleepy`` (begin -> nap, a 5 s sleep node -> finish) and says it is ready (a
NOTIFY on ``e2e_ready``) once it has started; it runs until killed.
"""

from __future__ import annotations

import asyncio
import sys

import asyncpg

import cyclone

NAP = 5.0  # seconds: long enough to kill the worker and start another while it sleeps


@cyclone.step("e2e.sleepy.begin", queue="e2e")
async def begin(ctx: cyclone.Context, n: int) -> int:
    return n


@cyclone.step("e2e.sleepy.finish", queue="e2e")
async def finish(ctx: cyclone.Context, n: int) -> str:
    await ctx.client.pool.execute("INSERT INTO finished (n) VALUES ($1)", n)
    return f"finished {n}"


sleepy = cyclone.define_result("e2e.sleepy", int, str)
_napped = sleepy.sleep("nap", after=[sleepy.node(begin)], sleep=NAP)
sleepy.set_result(sleepy.node(finish, after=[_napped]))


async def main(dsn: str) -> None:
    async with asyncpg.create_pool(dsn, min_size=1, max_size=4) as pool:
        client = cyclone.Client(pool)
        worker = cyclone.Worker(
            client, workflows=[sleepy], poll_interval=0.1, maintenance_interval=0.2
        )
        async with worker:  # started: say so, then run until killed
            await pool.execute("SELECT pg_notify('e2e_ready', $1)", worker.id)
            await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
