"""Run history for the benchmarks, and the claim's plan over it.

``build_history`` writes ``n`` finished standalone jobs in one set-based statement, each a
copy of a job that Cyclone itself ran to completion (so every column holds what a completed
job leaves: state, output, attempts, errors, finish time, completing attempt), with its own
time-ordered id, input and timestamps. Task rows are deleted on completion, so history lives
in ``cyclone_runs`` only.

Given a workflow, it copies one of its completed runs instead, each copy with copies of the
template's steps and edges: the history that node transitions must not scan.

``claim_plan`` renders the plan PostgreSQL picks for the worker's claim, both as a custom
plan (the first five executions of a prepared statement) and as the generic plan a
connection settles on afterwards.
"""

from __future__ import annotations

import json
from typing import Any

import asyncpg

import cyclone
from benchmarks.jobs import QUEUE, noop
from cyclone._storage.loader import Queries

# One completed run is the template, a job or a workflow run with its steps and edges; each
# copy brings copies of those. Ids are UUIDv7-shaped (48-bit milliseconds, version 7, variant
# 8), one millisecond apart and older than the template, so they sort as real ones.
_HISTORY = """
WITH template AS (
    SELECT * FROM cyclone_runs WHERE state = 'completed' AND name = $1 LIMIT 1
), copies AS (
    SELECT g.i,
        (lpad(to_hex((extract(epoch FROM t.created_at) * 1000)::bigint - 1 - $2 + g.i), 12, '0')
         || '7' || substr(md5(g.i::text), 1, 3) || '8' || substr(md5(g.i::text), 4, 15))::uuid
            AS id,
        make_interval(secs => ($2 - g.i + 1) / 1000.0) AS earlier
    FROM template t, generate_series(1, $2::int) AS g (i)
), runs AS (
    INSERT INTO cyclone_runs
        (id, name, job, state, input, output, result_node, key, unique_key, queue, nodes,
         remaining, priority, max_attempts, attempts, errors, error, deadline, created_at,
         finished_at, trace, completed_task, completed_claims)
    SELECT c.id, t.name, t.job, t.state, to_jsonb(c.i), t.output, t.result_node, t.key,
        t.unique_key, t.queue, t.nodes, t.remaining, t.priority, t.max_attempts, t.attempts,
        t.errors, t.error, t.deadline, t.created_at - c.earlier, t.finished_at - c.earlier,
        t.trace, CASE WHEN t.completed_task IS NOT NULL THEN c.i END, t.completed_claims
    FROM template t, copies c
), steps AS (
    INSERT INTO cyclone_steps
        (run_id, node, kind, queue, priority, max_attempts, state, pending_deps, attempts,
         errors, output, signal, wait_timeout, wait_until, finished_at, completed_task,
         completed_claims)
    SELECT c.id, s.node, s.kind, s.queue, s.priority, s.max_attempts, s.state, s.pending_deps,
        s.attempts, s.errors, s.output, s.signal, s.wait_timeout, s.wait_until,
        s.finished_at - c.earlier, c.i, s.completed_claims
    FROM template t JOIN cyclone_steps s ON s.run_id = t.id, copies c
)
INSERT INTO cyclone_edges (run_id, parent, child)
SELECT c.id, e.parent, e.child
FROM template t JOIN cyclone_edges e ON e.run_id = t.id, copies c
"""
_TABLES = ("cyclone_runs", "cyclone_tasks", "cyclone_steps", "cyclone_edges")


async def build_history(
    pool: asyncpg.Pool, n: int, workflow: cyclone.Workflow[int] | None = None
) -> None:
    """Add ``n`` finished jobs to the run history (or runs of ``workflow``, with their steps
    and edges), then VACUUM ANALYZE it."""
    client = cyclone.Client(pool)
    template: cyclone.Run
    if workflow is None:
        name, template = noop.name, await noop.enqueue(client, -1)
        worker = cyclone.Worker(client, steps=[noop], queues={QUEUE: 1})
    else:
        name, template = workflow.name, await workflow.submit(client, -1)
        worker = cyclone.Worker(client, workflows=[workflow], queues={QUEUE: 4})
    async with worker:
        if await template.wait(timeout=600) is not cyclone.RunState.COMPLETED:
            raise RuntimeError(f"the template run {template.id} of {name} did not complete")
    await pool.execute(_HISTORY, name, n, timeout=600)
    await pool.execute("VACUUM ANALYZE cyclone_runs, cyclone_steps, cyclone_edges", timeout=600)


async def autovacuum(pool: asyncpg.Pool, *, enabled: bool) -> None:
    """Turn autovacuum (and so auto-ANALYZE) off or back to its default on Cyclone's tables."""
    for table in _TABLES:
        if enabled:
            await pool.execute(f"ALTER TABLE {table} RESET (autovacuum_enabled)")
        else:
            await pool.execute(f"ALTER TABLE {table} SET (autovacuum_enabled = false)")


async def claim_plan(dsn: str, concurrency: int = 16) -> dict[str, str]:
    """The claim's custom and generic plans on a fresh connection, each as one line."""
    # The text exactly as the worker sends it for the benchmark's queue (no flow control).
    claim = Queries("public")["task_claim_plain"]
    conn = await asyncpg.connect(dsn)
    try:
        types = "text, text[], int, float8, text, text[]"
        await conn.execute(f"PREPARE bench_claim ({types}) AS {claim}")
        args = f"'{QUEUE}', ARRAY['{noop.name}'], {concurrency}, 30, 'bench-explain', '{{}}'"
        plans = {}
        for mode in ("custom", "generic"):
            await conn.execute(f"SET plan_cache_mode = force_{mode}_plan")
            raw = await conn.fetchval(f"EXPLAIN (FORMAT JSON) EXECUTE bench_claim ({args})")
            plans[mode] = shape(json.loads(raw)[0]["Plan"])
        return plans
    finally:
        await conn.close()


def shape(node: dict[str, Any]) -> str:
    """A plan tree as one line: ``Node on table using index [child, child]``."""
    label = node["Node Type"]
    if "Relation Name" in node:
        label += f" on {node['Relation Name']}"
    if "Index Name" in node:
        label += f" using {node['Index Name']}"
    children = [shape(child) for child in node.get("Plans", [])]
    return f"{label} [{', '.join(children)}]" if children else label


def scans_runs(plan: str) -> bool:
    """Whether a rendered plan reads cyclone_runs other than by its key."""
    return "Seq Scan on cyclone_runs" in plan or "Bitmap Heap Scan on cyclone_runs" in plan
