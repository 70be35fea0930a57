"""The two processes of the sync-producer test.

``python -m tests.frameworks.processes produce DSN N``: enqueues N jobs with the synchronous
client, half one at a time (each its own statement) and half in psycopg transactions of ten,
from four threads sharing one pool. ``python -m tests.frameworks.processes work DSN``: an
asyncio worker whose step records each job's number in ``done`` (in its completion
transaction) until stopped.
"""

from __future__ import annotations

import asyncio
import sys
import threading

import asyncpg
import psycopg_pool

import cyclone
import cyclone.sync


@cyclone.step("integrations.count", queue="count")
async def count(ctx: cyclone.Context, n: int) -> None:
    conn = await ctx.completion_tx()
    await conn.execute("INSERT INTO public.done (n) VALUES ($1)", n)


def produce(dsn: str, total: int) -> None:
    with psycopg_pool.ConnectionPool(dsn, min_size=1, max_size=4) as pool:
        client = cyclone.sync.Client(pool)

        def one_thread(start: int) -> None:
            numbers = range(start, total, 4)
            singles, batched = numbers[: len(numbers) // 2], list(numbers[len(numbers) // 2 :])
            for n in singles:
                client.enqueue(count, n)
            with pool.connection() as conn:
                for i in range(0, len(batched), 10):
                    with client.transaction(conn) as tx:
                        for n in batched[i : i + 10]:
                            client.enqueue_tx(tx, count, n)

        threads = [threading.Thread(target=one_thread, args=(s,)) for s in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()


async def work(dsn: str) -> None:
    async with asyncpg.create_pool(dsn, min_size=1, max_size=8) as pool:
        client = cyclone.Client(pool)
        worker = cyclone.Worker(client, steps=[count], queues={"count": 8}, poll_interval=0.2)
        await worker.run()


if __name__ == "__main__":
    if sys.argv[1] == "produce":
        produce(sys.argv[2], int(sys.argv[3]))
    else:
        asyncio.run(work(sys.argv[2]))
