"""The synchronous client's single enqueue against raw psycopg:
``python -m benchmarks.sync [--dsn DSN] [--calls 2000] [--rounds 3]``.

- floor: one parameterised ``INSERT`` of a JSON row per call, autocommit, on one psycopg
  connection held throughout (no Cyclone code).
- cyclone.sync: ``client.enqueue(kind, input)`` per call on a ``cyclone.sync.Client`` over the
  same kind of connection: its one autocommit statement writes the run and task rows and
  carries the wakeup's NOTIFY.

Calls per second for each, best of ``--rounds``, and the ratio. Without ``--dsn`` (or
``CYCLONE_BENCH_DSN``) it starts a throwaway server with PostgreSQL's durable defaults.
"""

from __future__ import annotations

import argparse
import asyncio
import time

import asyncpg
import msgspec
import psycopg

import cyclone
import cyclone.sync
from cyclone.testing import describe, postgres_server


class Job(msgspec.Struct):
    n: int


job = cyclone.register_kind("bench.sync", Job, None, queue="bench")
_TABLE = (
    "CREATE SCHEMA IF NOT EXISTS floor; DROP TABLE IF EXISTS floor.sync_jobs;"
    " CREATE TABLE floor.sync_jobs (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,"
    " queue text NOT NULL, payload jsonb NOT NULL, run_at timestamptz NOT NULL DEFAULT now())"
)


async def _prepare(dsn: str) -> None:
    async with asyncpg.create_pool(dsn, min_size=1, max_size=2) as pool:
        await cyclone.Client(pool).migrate()
        await pool.execute(_TABLE)


def floor(conn: psycopg.Connection[tuple[object, ...]], calls: int) -> float:
    """Calls per second of a raw single INSERT."""
    start = time.perf_counter()
    for n in range(calls):
        conn.execute(
            "INSERT INTO floor.sync_jobs (queue, payload) VALUES (%s, %s::jsonb)",
            ("bench", msgspec.json.encode(Job(n)).decode()),
        )
    return calls / (time.perf_counter() - start)


def enqueue(client: cyclone.sync.Client, calls: int) -> float:
    """Calls per second of ``client.enqueue``."""
    start = time.perf_counter()
    for n in range(calls):
        client.enqueue(job, Job(n))
    return calls / (time.perf_counter() - start)


def measure(dsn: str, calls: int, rounds: int) -> str:
    """Run both, interleaved round by round, and describe the figures."""
    asyncio.run(_prepare(dsn))
    with (
        psycopg.connect(dsn, autocommit=True) as raw,
        psycopg.connect(dsn, autocommit=True) as own,
    ):
        client = cyclone.sync.Client(own)
        floors, ours = [], []
        for _ in range(rounds):
            floors.append(floor(raw, calls))
            ours.append(enqueue(client, calls))
    best_floor, best_ours = max(floors), max(ours)
    return (
        f"raw psycopg INSERT: {best_floor:,.0f} calls/s\n"
        f"cyclone.sync enqueue: {best_ours:,.0f} calls/s\n"
        f"ratio: {best_ours / best_floor:.2f} (best of {rounds} rounds of {calls} calls)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--dsn")
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    if args.dsn:
        print(measure(args.dsn, args.calls, args.rounds))
        return
    with postgres_server(env_var="CYCLONE_BENCH_DSN", durable=True) as server:
        print(f"on {describe(server)}")
        print(measure(server.dsn, args.calls, args.rounds))


if __name__ == "__main__":
    main()
