"""A worker process for the wait-node kill test: ``python -m tests.e2e.events_app DSN``.

``prepare`` announces, in its completion transaction (so the NOTIFY arrives with the commit
that makes the wait node reachable), that the run now waits for its decision.
"""

from __future__ import annotations

import asyncio
import sys

import asyncpg
import msgspec

import cyclone


class Approval(msgspec.Struct):
    by: str


class Rejection(msgspec.Struct):
    reason: str


@cyclone.step("e2e.ev.prepare", queue="e2e_events")
async def prepare(ctx: cyclone.Context, order_id: int) -> int:
    conn = await ctx.completion_tx()
    await conn.execute("SELECT pg_notify('e2e_events_waiting', $1)", str(ctx.run_id))
    return order_id


@cyclone.step("e2e.ev.ship", queue="e2e_events")
async def ship(ctx: cyclone.Context, order_id: int) -> str:
    event = await ctx.output(decision)
    assert isinstance(event.payload, Approval)
    return f"shipped {order_id}, approved by {event.payload.by}"


# prepare -> decision (approved | rejected) -> ship, on "approved" only
flow = cyclone.define_result("e2e.events", int, str)
_prepared = flow.node(prepare)
decision = flow.wait_any(
    "decision", events={"approved": Approval, "rejected": Rejection}, after=[_prepared]
)
flow.set_result(flow.node(ship, after=[decision.when("approved")]))


async def main(dsn: str) -> None:
    async with asyncpg.create_pool(dsn, min_size=1, max_size=4) as pool:
        client = cyclone.Client(pool)
        worker = cyclone.Worker(
            client, workflows=[flow], poll_interval=0.1, maintenance_interval=0.2
        )
        async with worker:
            await asyncio.Event().wait()  # until killed


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
