"""One process of the submit_once stress test: ``python -m tests.e2e.submit_once_app DSN P``.

Runs 50 coroutines that each submit all 20 keys, in a shuffled order, half of them inside
their own transactions (where a conflict must leave the transaction usable). Keys k15-k19
get a different input from every other process, so they conflict. Prints one JSON line per
call: key, input variant, outcome and run id.
"""

from __future__ import annotations

import asyncio
import json
import random
import sys

import asyncpg
import msgspec

import cyclone


class Order(msgspec.Struct):
    key: str
    variant: int


@cyclone.step("stress.noop")
async def noop(ctx: cyclone.Context, order: Order) -> None:
    return None


stress = cyclone.define("stress", Order)
stress.node(noop)

KEYS = [f"k{i}" for i in range(20)]
CONFLICTING = set(KEYS[15:])


def variant(key: str, process: int) -> int:
    return process % 2 if key in CONFLICTING else 0


async def caller(client: cyclone.Client, pool: asyncpg.Pool, process: int, n: int) -> list[dict]:
    keys = KEYS[:]
    random.Random(process * 1000 + n).shuffle(keys)
    results = []
    for key in keys:
        order = Order(key, variant(key, process))
        record = {"key": key, "variant": order.variant}
        try:
            if n % 2:
                async with pool.acquire() as conn, conn.transaction():
                    try:
                        run, created = await stress.submit_once_tx(client, conn, key, order)
                    finally:
                        # Whatever happened, the transaction must still take statements.
                        record["tx_usable"] = await conn.fetchval("SELECT 1") == 1
            else:
                run, created = await stress.submit_once(client, key, order)
            record.update(outcome="created" if created else "existing", run_id=str(run.id))
        except cyclone.SubmitConflictError as exc:
            record.update(outcome="conflict", run_id=str(exc.run_id))
        results.append(record)
    return results


async def main(dsn: str, process: int) -> None:
    async with asyncpg.create_pool(dsn, min_size=2, max_size=10) as pool:
        client = cyclone.Client(pool, notify=False)
        batches = await asyncio.gather(*(caller(client, pool, process, n) for n in range(50)))
        await client.aclose()
    for batch in batches:
        for record in batch:
            print(json.dumps(record))


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], int(sys.argv[2])))
