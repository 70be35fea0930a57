"""The domain shared by the web examples: an order table and the workflow that fulfils it.

``place_order`` is the whole transactional pattern: the order row and the workflow run are
written in one transaction, keyed by the client's idempotency key, so a retried request
finds the first request's run and writes nothing new.
"""

from __future__ import annotations

import asyncpg
import msgspec

import cyclone

SCHEMA = """
CREATE TABLE IF NOT EXISTS orders (
    key text PRIMARY KEY,          -- the client's idempotency key
    customer text NOT NULL,
    cents integer NOT NULL CHECK (cents > 0),
    paid boolean NOT NULL DEFAULT false
)
"""


class NewOrder(msgspec.Struct):
    customer: str
    cents: int


class Fulfil(msgspec.Struct):
    key: str
    customer: str
    cents: int


@cyclone.step("shop.reserve", queue="orders")
async def reserve(ctx: cyclone.Context, order: Fulfil) -> str:
    return f"shelf-{len(order.customer)}"


@cyclone.step("shop.charge", queue="orders", max_attempts=5)
async def charge(ctx: cyclone.Context, order: Fulfil) -> str:
    # Marked paid in the same transaction that completes this step: never twice, never lost.
    conn = await ctx.completion_tx()
    await conn.execute("UPDATE orders SET paid = true WHERE key = $1", order.key)
    shelf = await ctx.output("shop.reserve")
    return f"{order.cents} cents charged to {order.customer}, shipping from {shelf}"


fulfil = cyclone.define_result("shop.fulfil", Fulfil, str)
fulfil.set_result(fulfil.node(charge, after=[fulfil.node(reserve)]))


async def place_order(
    client: cyclone.Client, conn: asyncpg.pool.PoolConnectionProxy, key: str, order: NewOrder
) -> tuple[cyclone.ResultRun[str], bool]:
    """Write the order and submit its fulfilment in one tracked transaction.

    Returns the run and whether this call created it. A retry with the same key and body
    returns the first run and writes nothing; a different body raises SubmitConflictError.
    """
    job = Fulfil(key, order.customer, order.cents)
    async with client.transaction(conn) as tx:  # wakes the workers after the commit
        # Submit first: a retry waits here for the first request's transaction and then gets
        # its run (created=False); inserting the order first would fail it on the primary key.
        run, created = await fulfil.submit_once_tx(client, tx, f"order:{key}", job)
        if created:
            await tx.execute(
                "INSERT INTO orders (key, customer, cents) VALUES ($1, $2, $3)",
                key,
                order.customer,
                order.cents,
            )
    return run, created
