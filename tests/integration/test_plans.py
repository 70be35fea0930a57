"""The hot statements use the indexes they were designed around (plans pinned, as data grows)."""

from __future__ import annotations

import json
import uuid

import cyclone
from cyclone import _queries as db
from cyclone.testing.plugin import CycloneEnv


@cyclone.step("plan.noop", queue="plans")
async def noop(ctx: cyclone.Context, n: int) -> None:
    return None


def scans(plan: object) -> set[str]:
    """Every index a plan reads, and "seq:<table>" for every table it reads in full."""
    found: set[str] = set()
    if isinstance(plan, dict):
        if "Index Name" in plan:
            found.add(plan["Index Name"])
        if plan.get("Node Type") == "Seq Scan":
            found.add(f"seq:{plan['Relation Name']}")
        for value in plan.values():
            found |= scans(value)
    elif isinstance(plan, list):
        for item in plan:
            found |= scans(item)
    return found


async def explain(env: CycloneEnv, name: str, *args: object) -> set[str]:
    text = await env.pool.fetchval(f"EXPLAIN (FORMAT JSON) {env.client.queries[name]}", *args)
    return scans(json.loads(text))


async def test_claim_heartbeat_and_completion_plans(cyclone_env: CycloneEnv) -> None:
    for _ in range(10):
        await noop.enqueue_many(cyclone_env.client, list(range(2_000)))
    await cyclone_env.pool.execute("ANALYZE")
    run, task = uuid.uuid4(), 1
    claim = await explain(cyclone_env, "task_claim", "plans", ["plan.noop"], 10, 30.0, "w", [])
    assert "idx_tasks_claim" in claim
    assert "cyclone_runs_pkey" in claim  # the claimed tasks' runs, by primary key
    beat = await explain(cyclone_env, "task_heartbeat", [run, run], [1, 2], [1, 1], 30.0)
    assert "cyclone_tasks_pkey" in beat
    done = await explain(
        cyclone_env, "job_complete_many", [run, run], [1, 2], [1, 1], ["null", "null"]
    )
    assert {"cyclone_tasks_pkey", "cyclone_runs_pkey"} <= done
    retry = await explain(
        cyclone_env, "task_retry_many", [run], [task], [1], [0.0], [None], [False]
    )
    assert "cyclone_tasks_pkey" in retry
    reclaim = await explain(cyclone_env, "task_reclaim", 100)
    assert "idx_tasks_lease" in reclaim
    # No statement reads the whole hot table: a task is found by (run, id) or by run.
    for name, args in [
        ("task_heartbeat", ([run], [task], [1], 30.0)),
        ("job_complete_many", ([run], [task], [1], ["null"])),
        ("node_finish_many", ([run], [task], [1], ["null"])),
        ("task_retry_many", ([run], [task], [1], [0.0], [None], [False])),
        ("task_reclaim", (100,)),
        ("job_fail", (run, task, 1, "{}", False)),
        ("node_fail", (run, task, 1, "{}", False)),
        ("job_end", (run, "cancelled", None)),
        ("run_cancel", (run,)),
        ("run_fail", (run, "{}", True)),
        ("job_reopen", (run,)),
    ]:
        plan = await explain(cyclone_env, name, *args)
        assert "seq:cyclone_tasks" not in plan, name
        assert "cyclone_tasks_pkey" in plan or "idx_tasks_lease" in plan, name


async def test_listing_walks_the_primary_key(cyclone_env: CycloneEnv) -> None:
    """Runs are listed newest first by the primary key, a name filter included: no index on
    names costs every insert an entry."""
    for _ in range(5):
        await noop.enqueue_many(cyclone_env.client, list(range(2_000)))
    await cyclone_env.pool.execute("ANALYZE")
    args = [None, "plan.noop", None, None, None, None, None, 50]
    plan = await explain(cyclone_env, "run_list", *args)
    assert "cyclone_runs_pkey" in plan
    assert "seq:cyclone_runs" not in plan


async def test_outcome_writes_find_tasks_by_key_with_many_running(
    cyclone_env: CycloneEnv,
) -> None:
    """With thousands of tasks running that the statistics do not know of yet (claimed since
    the last ANALYZE), completions, retries and heartbeats still look their tasks up by key:
    reading every running task per batch would make each write cost O(running)."""
    for _ in range(5):
        await noop.enqueue_many(cyclone_env.client, list(range(2_000)))
    await cyclone_env.pool.execute("ANALYZE")
    q = cyclone_env.client.queries
    async with cyclone_env.pool.acquire() as conn:
        rows = await db.task_claim(conn, q, "plans", ["plan.noop"], 5_000, 30.0, "w", [])
    some = rows[:100]
    run_ids, ids, claims = (
        [r["run_id"] for r in some],
        [r["id"] for r in some],
        [r["claims"] for r in some],
    )
    for name, args in [
        ("job_complete_many", (run_ids, ids, claims, ["null"] * 100)),
        ("node_finish_many", (run_ids, ids, claims, ["null"] * 100)),
        ("task_heartbeat", (run_ids, ids, claims, 30.0)),
        ("task_retry_many", (run_ids, ids, claims, [0.0] * 100, [None] * 100, [False] * 100)),
    ]:
        plan = await explain(cyclone_env, name, *args)
        assert "cyclone_tasks_pkey" in plan, (name, plan)
        assert "idx_tasks_lease" not in plan, (name, plan)
