"""The hot statements use the indexes they were designed around (plans pinned, as data grows)."""

from __future__ import annotations

import json

import cyclone
from cyclone.testing.plugin import CycloneEnv


@cyclone.step("plan.noop", queue="plans")
async def noop(ctx: cyclone.Context, n: int) -> None:
    return None


def indexes_used(plan: object) -> set[str]:
    found: set[str] = set()
    if isinstance(plan, dict):
        if "Index Name" in plan:
            found.add(plan["Index Name"])
        for value in plan.values():
            found |= indexes_used(value)
    elif isinstance(plan, list):
        for item in plan:
            found |= indexes_used(item)
    return found


async def explain(env: CycloneEnv, name: str, *args: object) -> set[str]:
    text = await env.pool.fetchval(f"EXPLAIN (FORMAT JSON) {env.client.queries[name]}", *args)
    return indexes_used(json.loads(text))


async def test_claim_heartbeat_and_completion_plans(cyclone_env: CycloneEnv) -> None:
    for _ in range(10):
        await noop.enqueue_many(cyclone_env.client, list(range(2_000)))
    await cyclone_env.pool.execute("ANALYZE")
    claim = await explain(cyclone_env, "task_claim", "plans", ["plan.noop"], 10, 30.0, "w", [])
    assert "idx_tasks_claim" in claim
    assert "cyclone_runs_pkey" in claim  # the claimed tasks' runs, by primary key
    beat = await explain(cyclone_env, "task_heartbeat", [1, 2], [1, 1], 30.0)
    assert "cyclone_tasks_pkey" in beat
    done = await explain(cyclone_env, "job_complete_many", [1, 2], [1, 1], ["null", "null"])
    assert {"cyclone_tasks_pkey", "cyclone_runs_pkey"} <= done
    reclaim = await explain(cyclone_env, "task_reclaim", 100)
    assert "idx_tasks_lease" in reclaim
