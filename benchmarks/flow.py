"""Flow-control figures: ``python -m benchmarks.flow [--dsn DSN] [--jobs N] [--backlog N]``.

Four claimers (as four workers) drain ``--jobs`` standalone jobs side by side, each claiming
10 at a time and completing them at once (no handler time: the claim's own cost shows), on
one server, in one run:

- ``before``: the claim as of migration 0007 (the text below), on a schema migrated to 0007;
- ``no limits``: today's claim of a queue with no limits (``task_claim_plain``, as a worker
  sends it) on a schema with every migration;
- ``full claim, no limits``: the same queue claimed by the full claim (``task_claim``),
  which a worker sends once the plain claim declines;
- ``global limit``: the same queue under a concurrency limit it never reaches (100) and a
  rate limit it never reaches: every claim locks and writes the queue's row;
- ``100 tenants``: no limit, the jobs spread over 100 group keys claimed in turns;
- ``before, backlog`` and ``no limits, backlog``: the first ``--jobs`` of a queue that holds
  ``--backlog`` more behind them (the server's default ``jit`` settings: a claim whose
  estimate grows with the backlog is compiled on every execution).

Each figure is the median of ``--rounds`` drains, as jobs per second and as a ratio to
``before``. Without ``--dsn`` (or ``CYCLONE_BENCH_DSN``) it starts a throwaway server.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time

import asyncpg

import cyclone
from cyclone._storage import queries as db
from cyclone._storage.loader import Queries
from cyclone.testing import describe, postgres_server

# The claim before flow control (cyclone/_storage/sql/queries.sql as of migration 0007), for the
# comparison only: the same parameters, the same rows.
BEFORE_CLAIM = """
    WITH async_commit AS (
        SELECT set_config('synchronous_commit', 'off', true)
    ), picked AS MATERIALIZED (
        SELECT t.run_id, t.id
        FROM __schema__.cyclone_tasks t
        WHERE t.state = 'available' AND t.queue = $1 AND t.available_at <= now()
          AND t.kind = ANY ($2::text[])
          -- A failed run starts nothing more, not even a node whose attempt failed or whose
          -- lease expired after the run failed; retry_all re-opens the run and so the task.
          -- A node's input may need its workflow's input function: only workers that know
          -- the workflow take its nodes.
          AND (SELECT r.state = 'pending' AND (t.node IS NULL OR r.name = ANY ($6::text[]))
               FROM __schema__.cyclone_runs r WHERE r.id = t.run_id)
          AND (t.sequence_key IS NULL OR NOT EXISTS (
                SELECT 1 FROM __schema__.cyclone_tasks h
                WHERE h.kind = t.kind AND h.sequence_key = t.sequence_key AND h.id < t.id))
        ORDER BY t.priority DESC, t.available_at, t.id
        LIMIT $3
        FOR UPDATE OF t SKIP LOCKED
    ), claimed AS (
        UPDATE __schema__.cyclone_tasks t
        SET state = 'running', attempt = t.attempt + 1, claims = t.claims + 1,
            lease_until = now() + make_interval(secs => $4), worker = $5, started_at = now()
        FROM picked, async_commit
        WHERE t.run_id = picked.run_id AND t.id = picked.id
          AND t.run_id = ANY (ARRAY(SELECT run_id FROM picked))
        RETURNING t.id, t.run_id, t.node, t.kind, t.attempt, t.max_attempts, t.claims,
            -- The claimed tasks' runs, by key again (one read for the three columns).
            (SELECT ARRAY[r.name, r.input::text, r.trace::text]
             FROM __schema__.cyclone_runs r WHERE r.id = t.run_id) AS run,
            (SELECT jsonb_object_agg(e.parent, s.output)::text
             FROM __schema__.cyclone_edges e
             JOIN __schema__.cyclone_steps s ON s.run_id = e.run_id AND s.node = e.parent
             WHERE e.run_id = t.run_id AND e.child = t.node) AS deps
    )
    SELECT id, run_id, node, kind, attempt, max_attempts, claims,
        run[1] AS name, run[2] AS input, run[3] AS trace, deps
    FROM claimed;
"""


@cyclone.step("bench.flow.noop", queue="bench-flow")
async def noop(ctx: cyclone.Context, n: int) -> None:
    return None


async def _drain(pool: asyncpg.Pool, q: Queries, claim: str, jobs: int) -> float:
    """Seconds for four claimers to claim and complete ``jobs`` jobs."""
    done = 0

    async def claimer(i: int) -> None:
        nonlocal done
        async with pool.acquire() as conn:
            while done < jobs:
                rows = [
                    r
                    for r in await conn.fetch(
                        claim, "bench-flow", [noop.name], 10, 30.0, f"w{i}", []
                    )
                    if r["id"] is not None
                ]
                if rows:
                    fence = db.Fence.of(db.TaskAttempt.of(r) for r in rows)
                    done_rows = db.Completions(fence, ["null"] * len(rows))
                    await db.job_complete_many(conn, q, done_rows)
                    done += len(rows)
                else:
                    await asyncio.sleep(0.001)

    started = time.perf_counter()
    await asyncio.gather(*(claimer(i) for i in range(4)))
    return time.perf_counter() - started


async def _fill(client: cyclone.Client, jobs: int, tenants: int, backlog: int = 0) -> None:
    schema = client._queries.schema
    await client.pool.execute(
        f"TRUNCATE {schema}.cyclone_runs, {schema}.cyclone_tasks, {schema}.cyclone_streams,"
        f" {schema}.cyclone_progress"
    )
    for start in range(0, backlog, 10_000):  # claimable, but behind the drained jobs
        batch = list(range(start, min(backlog, start + 10_000)))
        await noop.enqueue_many(client, batch, priority=-1)
    if tenants:
        per = jobs // tenants
        for t in range(tenants):
            await noop.enqueue_many(client, list(range(per)), group=f"tenant-{t}")
    else:
        await noop.enqueue_many(client, list(range(jobs)))
    await client.pool.execute("VACUUM ANALYZE")


async def measure(dsn: str, jobs: int, rounds: int, backlog: int) -> str:
    async with asyncpg.create_pool(dsn, min_size=4, max_size=8) as pool:
        before = cyclone.Client(pool, schema="flow_before")
        after = cyclone.Client(pool, schema="flow_after")
        before._queries.migrations = tuple(m for m in before._queries.migrations if m.version <= 7)
        await before.migrate()
        await after.migrate()
        old_claim = BEFORE_CLAIM.replace("__schema__", '"flow_before"')
        new_claim = after._queries["task_claim"]
        plain_claim = after._queries["task_claim_plain"]
        cases: dict[str, list[float]] = {
            "before": [],
            "no limits": [],
            "full claim, no limits": [],
            "global limit": [],
            "100 tenants": [],
            "before, backlog": [],
            "no limits, backlog": [],
        }
        for _ in range(rounds):  # interleaved, so that drift hits every case alike
            await _fill(before, jobs, 0)
            cases["before"].append(jobs / await _drain(pool, before._queries, old_claim, jobs))
            await after.queues.set_limits("bench-flow", create=True)
            await _fill(after, jobs, 0)
            cases["no limits"].append(jobs / await _drain(pool, after._queries, plain_claim, jobs))
            await _fill(after, jobs, 0)
            full = jobs / await _drain(pool, after._queries, new_claim, jobs)
            cases["full claim, no limits"].append(full)
            await after.queues.set_limits("bench-flow", concurrency=100, rate=10**6, per=1)
            await _fill(after, jobs, 0)
            limited = jobs / await _drain(pool, after._queries, new_claim, jobs)
            cases["global limit"].append(limited)
            await after.queues.set_limits("bench-flow")
            await _fill(after, jobs, 100)
            cases["100 tenants"].append(jobs / await _drain(pool, after._queries, new_claim, jobs))
            await _fill(before, jobs, 0, backlog)
            late = jobs / await _drain(pool, before._queries, old_claim, jobs)
            cases["before, backlog"].append(late)
            await _fill(after, jobs, 0, backlog)
            late = jobs / await _drain(pool, after._queries, plain_claim, jobs)
            cases["no limits, backlog"].append(late)
    base = statistics.median(cases["before"])
    lines = [f"{jobs} jobs (backlog {backlog}), 4 claimers of 10, median of {rounds} rounds:"]
    for name, rates in cases.items():
        rate = statistics.median(rates)
        spread = f"{min(rates):.0f}-{max(rates):.0f}"
        lines.append(f"  {name:22} {rate:8.0f} jobs/s ({spread})  ratio {rate / base:.2f}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--dsn", default=os.environ.get("CYCLONE_BENCH_DSN"))
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--backlog", type=int, default=50_000, help="jobs behind, for *backlog")
    args = parser.parse_args()
    if args.dsn:
        print(asyncio.run(measure(args.dsn, args.jobs, args.rounds, args.backlog)))
        return
    with postgres_server(env_var="CYCLONE_BENCH_DSN", durable=True) as server:
        print(f"# {describe(server)}, durable settings")
        print(asyncio.run(measure(server.dsn, args.jobs, args.rounds, args.backlog)))


if __name__ == "__main__":
    main()
