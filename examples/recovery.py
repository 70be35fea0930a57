"""Recovery workflows: find failed runs and start one keyed recovery run for each.

    python examples/recovery.py

Cyclone does not start anything when a run fails. This program charges two orders, one of
which fails for good, then does what a recovery job in your application would do: list the
failed runs and submit an "undo" workflow for each, keyed on the failed run's id, so two
processes that find the same failure start one recovery between them.
"""

from __future__ import annotations

import asyncio
import logging
import uuid

import asyncpg
import msgspec

import cyclone
from cyclone.testing import describe, postgres_server


class Order(msgspec.Struct):
    order_id: int
    cents: int


@cyclone.step("charge.card", max_attempts=2)
async def charge_card(ctx: cyclone.Context, order: Order) -> int:
    if order.cents > 10_000:
        raise RuntimeError(f"card declined for order {order.order_id}")
    return order.cents


@cyclone.step("charge.undo")
async def undo_charge(ctx: cyclone.Context, failed_run: uuid.UUID) -> str:
    # Look up what the failed run did and compensate (release stock, email the customer...).
    return f"compensated run {failed_run}"


charge = cyclone.define("charge", Order)
charge.node(charge_card)

undo = cyclone.define_result("charge.undo", uuid.UUID, str)
undo.set_result(undo.node(undo_charge))


async def recover_failed_runs(client: cyclone.Client) -> list[cyclone.ResultRun[str]]:
    """Submit one recovery run per failed charge run; safe to run from many processes."""
    recoveries = []
    query = cyclone.RunQuery(name="charge", state=cyclone.RunState.FAILED)
    while True:
        page = await client.list_runs(query)
        for failed in page.runs:
            run, created = await undo.submit_once(client, f"recover:{failed.id}", failed.id)
            print(f"  {'started' if created else 'found'} recovery {run.id} for {failed.id}")
            recoveries.append(run)
        if page.next_cursor is None:
            return recoveries
        query = cyclone.RunQuery(
            name="charge", state=cyclone.RunState.FAILED, cursor=page.next_cursor
        )


async def main(dsn: str) -> None:
    async with (
        asyncpg.create_pool(dsn, min_size=1, max_size=10) as pool,
        cyclone.Client(pool) as client,
    ):
        await client.migrate()
        async with cyclone.Worker(client, workflows=[charge, undo], poll_interval=0.2):
            runs = [
                await charge.submit(client, Order(1, 500)),
                await charge.submit(client, Order(2, 50_000)),
            ]
            for run in runs:
                print(f"charge run {run.id}: {await run.wait(timeout=60)}")
            # Two sweeps, as from two processes: the second finds the same recovery run.
            first = await recover_failed_runs(client)
            second = await recover_failed_runs(client)
            assert [r.id for r in first] == [r.id for r in second]
            for run in first:
                print(f"recovery {run.id}: {await run.result(timeout=60)}")


if __name__ == "__main__":
    logging.basicConfig(level=logging.ERROR)
    with postgres_server(env_var="CYCLONE_DATABASE_URL") as server:
        print(f"Using {describe(server)}")
        asyncio.run(main(server.dsn))
