"""The client's read models behind the dashboard: queue filter, bounded walks, counts,
per-minute throughput, payloads and the change watch; their plans pinned."""

from __future__ import annotations

import asyncio
import json
import uuid

import pytest

import cyclone
from cyclone.testing.plugin import CycloneEnv
from tests.integration.test_plans import scans
from tests.web.flows import FAILING, STEPS, WORKFLOWS, approval, echo, pipeline


@pytest.fixture(autouse=True)
def _charge_succeeds() -> None:
    FAILING["charge"] = False


async def test_filter_by_queue_matches_jobs_and_workflow_nodes(cyclone_env: CycloneEnv) -> None:
    client = cyclone_env.client
    job = await echo.enqueue(client, 1)
    other = await echo.enqueue(client, 2, queue="elsewhere")
    wf = await pipeline.submit(client, {"id": 1})
    by_queue = {
        q: [r.id for r in (await client.list_runs(cyclone.RunQuery(queue=q))).runs]
        for q in ("web", "payments", "elsewhere", "none")
    }
    assert by_queue == {
        "web": [wf.id, job.id],
        "payments": [wf.id],
        "elsewhere": [other.id],
        "none": [],
    }
    assert await client.count_runs(cyclone.RunQuery(queue="web")) == 2


async def test_a_bounded_walk_stops_early_and_continues(cyclone_env: CycloneEnv) -> None:
    client = cyclone_env.client
    old = await echo.enqueue_many(client, list(range(6)))
    await pipeline.submit(client, {"id": 1})
    for _ in range(5):
        await pipeline.submit(client, {"id": 2})
    query = cyclone.RunQuery(name="web.echo", scan=4)
    first = await client.list_runs(query)
    assert first.runs == [] and first.next_cursor is not None  # 4 newest are pipelines
    seen, cursor = [], first.next_cursor
    while cursor is not None:
        page = await client.list_runs(cyclone.RunQuery(name="web.echo", scan=4, cursor=cursor))
        seen += [r.id for r in page.runs]
        cursor = page.next_cursor
    assert seen == [r.id for r in reversed(old)]
    assert await client.count_runs(cyclone.RunQuery(name="web.echo"), at_most=4) == 4
    assert await client.count_runs(cyclone.RunQuery(name="web.echo")) == 6
    assert await client.count_runs(cyclone.RunQuery(name="web.echo", scan=8)) == 2
    with pytest.raises(cyclone.InvalidInputError, match="scan must be an int"):
        await client.list_runs(cyclone.RunQuery(scan=0))
    with pytest.raises(cyclone.InvalidInputError, match="at_most must be an int"):
        await client.count_runs(at_most=0)


async def test_throughput_counts_completions_and_failures_per_minute(
    cyclone_env: CycloneEnv,
) -> None:
    client = cyclone_env.client
    await echo.enqueue_many(client, [1, 2, 3])
    FAILING["charge"] = True
    failed = await pipeline.submit(client, {"id": 1})
    await cyclone_env.drain(steps=STEPS, workflows=WORKFLOWS)
    assert await failed.status() is cyclone.RunState.FAILED
    points = await client.throughput(minutes=60)
    totals = {(p.queue, p.completed, p.failed) for p in points}
    # web: three jobs and the pipeline's fetch; payments: the charge that failed.
    assert totals == {("web", 4, 0), ("payments", 0, 1)}
    assert all(p.minute.second == 0 and p.minute.tzinfo is not None for p in points)
    with pytest.raises(cyclone.InvalidInputError, match="at most 1440"):
        await client.throughput(minutes=2000)


async def test_payloads_of_jobs_results_and_waits(cyclone_env: CycloneEnv) -> None:
    client = cyclone_env.client
    job = await echo.enqueue(client, {"a": [1, "<b>"]})
    wf = await pipeline.submit(client, {"id": 7})
    wait = await approval.submit(client, {"id": 8})
    await client.signal(wait.id, "approve", {"ok": True})
    await cyclone_env.drain(steps=STEPS, workflows=WORKFLOWS)
    assert (await job.payloads()) == cyclone.RunPayloads(
        input={"a": [1, "<b>"]}, output={"a": [1, "<b>"]}, nodes={}
    )
    got = await wf.payloads()
    assert (got.input, got.output) == ({"id": 7}, "shipped")
    assert got.nodes["web.fetch"] == cyclone.NodePayloads(
        queue="web", output={"fetched": 7}, signal=None, signalled=False
    )
    waited = await wait.payloads()
    assert waited.output is None  # no result node
    assert waited.nodes["approve"].signal == {"ok": True} and waited.nodes["approve"].signalled
    with pytest.raises(cyclone.RunNotFoundError):
        await cyclone.Run(client, uuid.uuid4()).payloads()


async def test_watch_is_set_by_new_work_and_ended_runs(cyclone_env: CycloneEnv) -> None:
    client = cyclone_env.client
    async with client.watch() as changed:
        await asyncio.wait_for(changed.wait(), 30)  # the listener connected
        changed.clear()
        await echo.enqueue(client, 1)
        await asyncio.wait_for(changed.wait(), 30)


async def explain(env: CycloneEnv, name: str, *args: object) -> set[str]:
    text = await env.pool.fetchval(f"EXPLAIN (FORMAT JSON) {env.client._queries[name]}", *args)
    return scans(json.loads(text))


async def test_dashboard_plans(cyclone_env: CycloneEnv) -> None:
    """Every read model is served by an index, with 10,000 runs and workflow steps."""
    client = cyclone_env.client
    for _ in range(5):
        await echo.enqueue_many(client, list(range(1_000)))
        await cyclone_env.pool.execute(
            "INSERT INTO cyclone_steps (run_id, node, kind, queue, priority, max_attempts,"
            " state, pending_deps, finished_at)"
            " SELECT gen_random_uuid(), 'n', 'k', 'q', 0, 1, 'completed', 0,"
            " now() - g * interval '1 minute' FROM generate_series(1, 1000) g"
        )
    await cyclone_env.pool.execute("ANALYZE")
    run = (await client.list_runs(cyclone.RunQuery(limit=1))).runs[0].id
    no_filter = [None] * 7
    for name, args in [
        ("run_search", (*no_filter, 51, 5000)),
        ("run_search", (None, None, None, None, run, ["failed"], "web", 51, 5000)),
        ("run_search", ("web.echo", "k", None, None, None, None, None, 51, None)),
        ("run_count", (*no_filter, 10_000, 5000)),
        ("run_walk_end", (run, 5000)),
    ]:
        plan = await explain(cyclone_env, name, *args)
        assert "cyclone_runs_pkey" in plan or "idx_runs_submit_key" in plan, (name, plan)
        assert "seq:cyclone_runs" not in plan and "seq:cyclone_steps" not in plan, (name, plan)
    for name in ("run_payload", "node_payloads"):
        plan = await explain(cyclone_env, name, run)
        assert not {p for p in plan if p.startswith("seq:")}, (name, plan)
    plan = await explain(cyclone_env, "throughput_minutes", 60)
    assert {"idx_runs_finished", "idx_steps_finished"} <= plan, plan
