"""The drain benchmark's worker process: ``python -m benchmarks.drain_worker DSN N CONCURRENCY``.

Starts one worker on the prefilled queue and prints, as JSON, the seconds from its start until
no task is left.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time

import asyncpg

import cyclone
from benchmarks.jobs import QUEUE, noop


async def main(dsn: str, n: int, concurrency: int) -> None:
    async with asyncpg.create_pool(dsn, min_size=4, max_size=8) as pool:
        client = cyclone.Client(pool)
        worker = cyclone.Worker(
            client, steps=[noop], queues={QUEUE: concurrency}, poll_interval=0.05
        )
        start = time.perf_counter()
        async with worker:
            # The bench polls for the end: checking costs one small query every 20 ms.
            while await pool.fetchval("SELECT count(*) FROM cyclone_tasks") > 0:  # noqa: ASYNC110
                await asyncio.sleep(0.02)
            elapsed = time.perf_counter() - start
        print(json.dumps({"seconds": elapsed, "n": n}))


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3])))
