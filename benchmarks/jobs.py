"""The job every benchmark runs: a no-op step that counts its calls (and its plain ``def``
twin, which a worker runs in a thread and which counts nothing: the worker's drain tells
when it is done)."""

from __future__ import annotations

import asyncio

import asyncpg

import cyclone

QUEUE = "bench"


class Tally:
    """Counts handler starts; ``done`` is set once ``arm``'s target is reached."""

    def __init__(self) -> None:
        self.count = 0
        self.target: int | None = None
        self.done = asyncio.Event()

    def arm(self, target: int) -> None:
        self.count, self.target, self.done = 0, target, asyncio.Event()

    def hit(self) -> None:
        self.count += 1
        if self.target is not None and self.count >= self.target:
            self.done.set()


handled = Tally()


@cyclone.step("bench.noop", queue=QUEUE)
async def noop(ctx: cyclone.Context, i: int) -> None:
    handled.hit()


@cyclone.step("bench.noop_sync", queue=QUEUE)
def noop_sync(ctx: cyclone.Context, i: int) -> None:
    return None


async def truncate(pool: asyncpg.Pool) -> None:
    """Empty Cyclone's tables and refresh every table's statistics."""
    await pool.execute(
        "TRUNCATE cyclone_runs, cyclone_steps, cyclone_edges, cyclone_tasks, cyclone_streams,"
        " cyclone_progress"
    )
    await pool.execute("VACUUM ANALYZE")
