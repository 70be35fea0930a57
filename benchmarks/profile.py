"""Where the time goes: ``python -m benchmarks.profile [--dsn DSN] [--pyinstrument]``.

Runs the embedded-worker drain at concurrency 16 and the single enqueue (with and without a
worker) on a server with ``pg_stat_statements`` loaded (a throwaway one unless ``--dsn``, whose
server must preload it), and prints for each: wall time, this process's CPU time, the
server's CPU time (its backends, from /proc), the server's execution time, and every statement
sent per job with its share of the server's time and of its planning time (a statement the
plan cache plans afresh each time shows there). ``--pyinstrument`` also prints the top of a
pyinstrument profile of each scenario (a second run, as the profiler slows it).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import asyncpg

import cyclone
from benchmarks import embedded, library
from benchmarks.floor import Figure
from cyclone.testing import postgres_server

_STATEMENTS = """
SELECT calls, total_exec_time, total_plan_time,
    regexp_replace(query, '\\s+', ' ', 'g') AS query
FROM pg_stat_statements
WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
ORDER BY calls DESC, total_exec_time DESC
"""


def _ticks(pid: int) -> int:
    """utime + stime of a process, in clock ticks."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def _server_cpu(postmaster: int) -> float:
    """CPU seconds used so far by the postmaster's live children (backends, WAL writer...)."""
    total = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            if int(stat.rsplit(")", 1)[1].split()[1]) == postmaster:
                total += _ticks(int(entry))
        except (OSError, ValueError):
            continue  # the process ended while we looked
    return total / os.sysconf("SC_CLK_TCK")


def _postmaster(data_directory: str) -> int | None:
    """The postmaster's pid, if the server runs on this machine (not in a container)."""
    try:
        return int(Path(data_directory, "postmaster.pid").read_text().split()[0])
    except OSError:
        return None


async def profile(
    pool: asyncpg.Pool, name: str, jobs: int, run: Callable[[], Awaitable[Figure]]
) -> str:
    """One scenario with every cost counted."""
    postmaster = _postmaster(await pool.fetchval("SHOW data_directory"))
    await pool.execute("VACUUM ANALYZE")
    await pool.execute("SELECT pg_stat_statements_reset()")
    cpu, server, wall = time.process_time(), _server_cpu(postmaster or -1), time.perf_counter()
    figure = await run()
    wall = time.perf_counter() - wall
    cpu = time.process_time() - cpu
    server = _server_cpu(postmaster or -1) - server
    rows = await pool.fetch(_STATEMENTS)
    executed = sum(r["total_exec_time"] for r in rows) / 1000
    lines = [
        f"## {name}: {figure.value:,.0f} {figure.unit} ({figure.detail})",
        f"wall {wall:.2f} s (setup included); this process's CPU {cpu:.2f} s; "
        + (f"server CPU {server:.2f} s; " if postmaster else "")
        + f"server execution {executed:.2f} s; "
        f"{sum(r['calls'] for r in rows) / jobs:.2f} statements per job in all",
        "",
        "| per job | server ms/job | planning ms/job | statement |",
        "| ---: | ---: | ---: | --- |",
    ]
    for r in rows:
        if r["calls"] >= jobs / 100:  # setup and polling statements are left out
            query = r["query"] if len(r["query"]) <= 90 else r["query"][:87] + "..."
            per_job, planned = r["total_exec_time"] / jobs, r["total_plan_time"] / jobs
            lines.append(f"| {r['calls'] / jobs:.2f} | {per_job:.3f} | {planned:.3f} | `{query}` |")
    return "\n".join(lines)


async def main(dsn: str, use_pyinstrument: bool) -> None:
    async with asyncpg.create_pool(dsn, min_size=2, max_size=20) as pool:
        await cyclone.Client(pool).migrate()
        await pool.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        scenarios: list[tuple[str, int, Callable[[], Awaitable[Figure]]]] = [
            ("drain c16", 10_000, lambda: embedded.drain(pool, 10_000, 16)),
            ("enqueue", 2_000, lambda: library.enqueue_single(pool, 2_000)),
            ("enqueue + worker", 2_000, lambda: embedded.enqueue_with_worker(pool, 2_000)),
        ]
        await embedded.drain(pool, 2_000, 16)  # warm up connections and statement caches
        for name, jobs, run in scenarios:
            print(await profile(pool, name, jobs, run), end="\n\n")
            if use_pyinstrument:
                from pyinstrument import Profiler

                with Profiler(async_mode="enabled") as profiler:
                    await run()
                text = profiler.output_text(unicode=False, color=False, short_mode=True)
                print("```", *text.splitlines()[:60], "```", sep="\n", end="\n\n")


def cli() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--dsn", default=os.environ.get("CYCLONE_BENCH_DSN"))
    parser.add_argument("--pyinstrument", action="store_true")
    args = parser.parse_args()
    if args.dsn:
        asyncio.run(main(args.dsn, args.pyinstrument))
        return
    # Planning counted too: a statement the plan cache plans on every execution shows there.
    settings = {
        "shared_preload_libraries": "pg_stat_statements",
        "pg_stat_statements.track_planning": "on",
    }
    with postgres_server(env_var="CYCLONE_BENCH_DSN", durable=True, settings=settings) as server:
        asyncio.run(main(server.dsn, args.pyinstrument))


if __name__ == "__main__":
    cli()
