"""The dashboard's runs list with 100,000 runs in the database: page load p50/p95 per filter.

    python -m benchmarks.dashboard [--dsn DSN] [--runs 100000] [--requests 200]

Without ``--dsn`` (or ``CYCLONE_BENCH_DSN``) it starts a throwaway server, as
``python -m benchmarks`` does. Requests go to the ASGI app in process (httpx), so a figure is
the app's time: its queries, the template, no network.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
from typing import Any

import asyncpg
import httpx

import cyclone
import cyclone.web
from cyclone.testing import describe, postgres_server

QUEUES = ("bench", "mail", "reports")


@cyclone.step("bench.page", queue="bench")
async def page_job(ctx: cyclone.Context, i: int) -> None:
    return None


async def fill(pool: asyncpg.Pool, runs: int) -> None:
    """``runs`` jobs across three queues, ended as a real history would be: most completed,
    some failed with an error, the newest still pending."""
    client = cyclone.Client(pool)
    await pool.execute(
        "TRUNCATE cyclone_runs, cyclone_steps, cyclone_edges, cyclone_tasks, cyclone_streams,"
        " cyclone_progress"
    )
    for lo in range(0, runs, 5_000):
        queue = QUEUES[lo // 5_000 % len(QUEUES)]
        await page_job.enqueue_many(client, list(range(lo, min(runs, lo + 5_000))), queue=queue)
    # Benchmark set-up, not library code: end most runs directly, as workers would have.
    await pool.execute(
        """
        WITH ranked AS (SELECT id, row_number() OVER (ORDER BY id) AS n FROM cyclone_runs)
        UPDATE cyclone_runs r SET
            state = CASE WHEN ranked.n % 10 = 0 THEN 'failed' ELSE 'completed' END,
            error = CASE WHEN ranked.n % 10 = 0
                THEN '{"type": "ValueError", "message": "declined"}'::jsonb END,
            output = 'null', attempts = 1, finished_at = now()
        FROM ranked WHERE ranked.id = r.id AND ranked.n <= $1
        """,
        runs - 1_000,
    )
    await pool.execute(
        "DELETE FROM cyclone_tasks t USING cyclone_runs r"
        " WHERE t.run_id = r.id AND r.state <> 'pending'"
    )
    await pool.execute("VACUUM ANALYZE")


async def measure(dsn: str, runs: int, requests: int) -> list[tuple[str, float, float]]:
    """p50 and p95 (ms) of each runs-list request."""
    async with asyncpg.create_pool(dsn, min_size=2, max_size=10) as pool:
        client = cyclone.Client(pool)
        await client.migrate()
        await fill(pool, runs)
        app = cyclone.web.dashboard(client)
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as http:
            first = await http.get("/runs")
            cursor = first.text.split('id="older" href="/runs?cursor=')[1].split('"')[0]
            cases: list[tuple[str, dict[str, Any]]] = [
                ("newest page", {}),
                ("older page (cursor)", {"cursor": cursor}),
                ("state=failed", {"state": "failed"}),
                ("state=pending", {"state": "pending"}),
                ("queue=mail", {"queue": "mail"}),
                ("name=bench.page", {"name": "bench.page"}),
                ("no match (bounded walk)", {"name": "nothing"}),
            ]
            results = []
            for label, params in cases:
                times = []
                for _ in range(requests):
                    start = time.perf_counter()
                    response = await http.get("/runs", params=params)
                    times.append((time.perf_counter() - start) * 1000)
                    assert response.status_code == 200, response.text[:200]
                times.sort()
                p95 = times[int(len(times) * 0.95) - 1]
                results.append((label, statistics.median(times), p95))
        await client.aclose()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--dsn", default=os.environ.get("CYCLONE_BENCH_DSN"))
    parser.add_argument("--runs", type=int, default=100_000)
    parser.add_argument("--requests", type=int, default=200)
    args = parser.parse_args()

    def show(dsn: str) -> None:
        print(f"runs list, {args.runs:,} runs, {args.requests} requests each (ms)")
        print(f"{'request':<26} {'p50':>8} {'p95':>8}")
        for label, p50, p95 in asyncio.run(measure(dsn, args.runs, args.requests)):
            print(f"{label:<26} {p50:>8.1f} {p95:>8.1f}")

    if args.dsn:
        show(args.dsn)
        return
    with postgres_server(env_var="CYCLONE_BENCH_DSN", durable=True) as server:
        print(f"# {describe(server)}, durable settings")
        show(server.dsn)


if __name__ == "__main__":
    main()
