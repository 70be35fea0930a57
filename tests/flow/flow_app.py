"""A worker process for the flow-control tests: ``python -m tests.flow.flow_app DSN``.

Its step records when it started by the database's clock, when its claim began (the
claim's now()) and its tenant, holds its slot
for the input's milliseconds, and returns. Leases are short, so the tasks of a worker killed
with SIGKILL go back to the queue within seconds.
"""

from __future__ import annotations

import asyncio
import sys

import asyncpg
import msgspec

import cyclone


class Work(msgspec.Struct):
    tenant: str
    hold_ms: int


@cyclone.step("flow.work", queue="flow", max_attempts=5)
async def work(ctx: cyclone.Context, job: Work) -> None:
    await ctx.client.pool.execute(
        "INSERT INTO flow_starts (run_id, tenant, at, claimed_at) SELECT $1, $2,"
        " clock_timestamp(), (SELECT t.started_at FROM cyclone_tasks t WHERE t.run_id = $1)",
        ctx.run_id,
        job.tenant,
    )
    await asyncio.sleep(job.hold_ms / 1000)


async def main(dsn: str) -> None:
    async with asyncpg.create_pool(dsn, min_size=1, max_size=6) as pool:
        client = cyclone.Client(pool)
        worker = cyclone.Worker(
            client,
            steps=[work],
            queues={"flow": 10},
            poll_interval=0.2,
            lease=2.0,
            maintenance_interval=0.2,
        )
        await worker.run()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
