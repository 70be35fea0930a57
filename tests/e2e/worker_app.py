"""A worker process for the end-to-end tests: ``python -m tests.e2e.worker_app DSN LEASE``.

Its step writes a business row in the completion transaction, reports that it started (a row,
and a NOTIFY the test listens for), and on its first attempt hangs until the process is killed.
The worker says it is ready (a NOTIFY on ``e2e_ready``) once it has started.
"""

from __future__ import annotations

import asyncio
import sys

import asyncpg

import cyclone


@cyclone.step("e2e.charge", queue="e2e", max_attempts=3)
async def charge(ctx: cyclone.Context, order_id: int) -> str:
    conn = await ctx.completion_tx()
    await conn.execute(
        "INSERT INTO charges (order_id, attempt) VALUES ($1, $2)", order_id, ctx.attempt
    )
    await ctx.client.pool.execute(
        "WITH s AS (INSERT INTO started (order_id, attempt) VALUES ($1, $2) RETURNING attempt)"
        " SELECT pg_notify('e2e_started', attempt::text) FROM s",
        order_id,
        ctx.attempt,
    )
    if ctx.attempt == 1:
        await asyncio.sleep(3600)  # killed here, before the completion commits
    return f"charged {order_id}"


@cyclone.step("e2e.prepare", queue="e2e")
async def prepare(ctx: cyclone.Context, order_id: int) -> int:
    return order_id


@cyclone.step("e2e.ship", queue="e2e")
async def ship(ctx: cyclone.Context, order_id: int) -> str:
    charged = await ctx.output("charge")
    return f"shipped after {charged}"


# prepare -> charge (killed mid-step on its first attempt) -> ship
flow = cyclone.define_result("e2e.flow", int, str)
_prepared = flow.node(prepare)
_charged = flow.node(charge, name="charge", after=[_prepared])
flow.set_result(flow.node(ship, after=[_charged]))


async def main(dsn: str, lease: float) -> None:
    async with asyncpg.create_pool(dsn, min_size=1, max_size=4) as pool:
        client = cyclone.Client(pool)
        worker = cyclone.Worker(
            client,
            steps=[charge],
            workflows=[flow],
            poll_interval=0.1,
            lease=lease,
            maintenance_interval=0.2,
        )
        async with worker:  # started: say so, then run until killed or interrupted
            await pool.execute("SELECT pg_notify('e2e_ready', $1)", worker.id)
            await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], float(sys.argv[2])))
