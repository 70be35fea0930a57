"""A worker process with a batch step: ``python -m tests.e2e.batch_app DSN LEASE``.

Its batch handler writes one business row per item in the batch's completion transaction,
reports the items' attempts (a NOTIFY on ``e2e_batch``, e.g. ``1,1,1``), and while any item
is on its first attempt hangs until the process is killed.
"""

from __future__ import annotations

import asyncio
import sys

import asyncpg

import cyclone


@cyclone.batch_step("e2e.charge_batch", queue="e2e-batch", max_size=5, max_wait=2)
async def charge_batch(ctx: cyclone.BatchContext, order_ids: list[int]) -> list[str]:
    conn = await ctx.completion_tx()
    await conn.executemany(
        "INSERT INTO charges (order_id, attempt) VALUES ($1, $2)",
        [(i, a.attempt) for i, a in zip(order_ids, ctx.attempts, strict=True)],
    )
    attempts = ",".join(str(a.attempt) for a in ctx.attempts)
    await ctx.client.pool.execute("SELECT pg_notify('e2e_batch', $1)", attempts)
    if any(a.attempt == 1 for a in ctx.attempts):
        await asyncio.sleep(3600)  # killed here, before the completion commits
    return [f"charged {i}" for i in order_ids]


async def main(dsn: str, lease: float) -> None:
    async with asyncpg.create_pool(dsn, min_size=1, max_size=4) as pool:
        worker = cyclone.Worker(
            cyclone.Client(pool),
            steps=[charge_batch],
            queues={"e2e-batch": 10},
            poll_interval=0.1,
            lease=lease,
            maintenance_interval=0.2,
        )
        async with worker:
            await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], float(sys.argv[2])))
