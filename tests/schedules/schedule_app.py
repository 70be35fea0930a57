"""A worker process for the schedule tests: ``python -m tests.schedules.schedule_app DSN``.

It declares one every-second schedule of a job that records its slot; several of these run
at once against one database, and the test counts the runs per slot.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import sys

import asyncpg

import cyclone


@cyclone.action("sched.e2e.tick", queue="ticks")
async def tick(ctx: cyclone.Context, slot: str) -> None:
    return None


every_second = cyclone.schedule(
    "e2e.every-second",
    tick,
    every=dt.timedelta(seconds=1),
    input=lambda slot: slot.isoformat(),
)


async def main(dsn: str) -> None:
    async with asyncpg.create_pool(dsn, min_size=1, max_size=4) as pool:
        client = cyclone.Client(pool)
        worker = cyclone.Worker(
            client, steps=[tick], schedules=[every_second], poll_interval=0.2, lease=5.0
        )
        await worker.run()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
