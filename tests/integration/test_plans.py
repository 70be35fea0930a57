"""The hot statements use the indexes they were designed around (plans pinned, as data grows)."""

from __future__ import annotations

import datetime as dt
import json
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import pytest

import cyclone
from cyclone._storage import queries as db
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
    text = await env.pool.fetchval(f"EXPLAIN (FORMAT JSON) {env.client._queries[name]}", *args)
    return scans(json.loads(text))


Statements = list[tuple[str, tuple[object, ...]]]


async def each_plan(
    env: CycloneEnv, statements: Statements
) -> AsyncIterator[tuple[str, tuple[object, ...], str, Any]]:
    """(name, arguments, mode, plan) of each statement, as a connection plans it on its first
    uses (custom) and once it has settled on its cached plan (generic)."""
    async with env.pool.acquire() as conn:
        for mode in ("custom", "generic"):
            await conn.execute(f"SET plan_cache_mode = force_{mode}_plan")
            for name, args in statements:
                statement = await conn.prepare(f"EXPLAIN (FORMAT JSON) {env.client._queries[name]}")
                yield name, args, mode, json.loads(await statement.fetchval(*args))


async def test_claim_heartbeat_and_completion_plans(cyclone_env: CycloneEnv) -> None:
    for _ in range(10):
        await noop.enqueue_many(cyclone_env.client, list(range(2_000)))
    await cyclone_env.pool.execute("ANALYZE")
    run, task = uuid.uuid4(), 1
    claim = await explain(cyclone_env, "task_claim", "plans", ["plan.noop"], 10, 30.0, "w", [])
    assert "idx_tasks_claim" in claim
    assert "cyclone_runs_pkey" in claim  # the claimed tasks' runs, by primary key
    plain = await explain(
        cyclone_env, "task_claim_plain", "plans", ["plan.noop"], 10, 30.0, "w", []
    )
    assert {"idx_tasks_claim", "cyclone_runs_pkey"} <= plain
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
    reclaim = await explain(cyclone_env, "task_reclaim", 100, "w")
    assert "idx_tasks_lease" in reclaim
    # No statement reads the whole hot table: a task is found by (run, id) or by run.
    for name, args in [
        ("task_heartbeat", ([run], [task], [1], 30.0)),
        ("job_complete_many", ([run], [task], [1], ["null"])),
        ("node_complete_many", ([run], [task], [1], ["null"])),
        ("task_retry_many", ([run], [task], [1], [0.0], [None], [False])),
        ("task_reclaim", (100, "w")),
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
    # run_search: name, key, created_after, created_before, cursor, states, queue, limit, scan
    args = ["plan.noop", None, None, None, None, None, None, 50, None]
    plan = await explain(cyclone_env, "run_search", *args)
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
    q = cyclone_env.client._queries
    async with cyclone_env.pool.acquire() as conn:
        rows = await db.task_claim(
            conn, q, db.ClaimRequest("plans", ["plan.noop"], 5_000, 30.0, "w", [])
        )
    some = rows[:100]
    run_ids, ids, claims = (
        [r["run_id"] for r in some],
        [r["id"] for r in some],
        [r["claims"] for r in some],
    )
    for name, args in [
        ("job_complete_many", (run_ids, ids, claims, ["null"] * 100)),
        ("node_complete_many", (run_ids, ids, claims, ["null"] * 100)),
        ("task_heartbeat", (run_ids, ids, claims, 30.0)),
        ("task_retry_many", (run_ids, ids, claims, [0.0] * 100, [None] * 100, [False] * 100)),
    ]:
        plan = await explain(cyclone_env, name, *args)
        assert "cyclone_tasks_pkey" in plan, (name, plan)
        assert "idx_tasks_lease" not in plan, (name, plan)


# What Cyclone's completed jobs leave behind: the run row alone, completed, with its output,
# attempt record and completing attempt (their task rows were deleted).
_HISTORY = """
INSERT INTO cyclone_runs
    (id, name, job, state, input, output, queue, nodes, remaining, max_attempts, attempts,
     created_at, finished_at, completed_task, completed_claims)
SELECT gen_random_uuid(), 'plan.noop', true, 'completed', to_jsonb(g.i), 'null', 'plans', 1, 0,
       1, 1, now() - make_interval(secs => g.i), now() - make_interval(secs => g.i), g.i, 1
FROM generate_series(1, $1::int) AS g (i)
"""


def plan_nodes(plan: object) -> Iterator[dict[str, Any]]:
    """Every node of an EXPLAIN (FORMAT JSON) plan, depth first."""
    if isinstance(plan, dict):
        if "Node Type" in plan:
            yield plan
        for value in plan.values():
            yield from plan_nodes(value)
    elif isinstance(plan, list):
        for item in plan:
            yield from plan_nodes(item)


def reads_of(plan: object, table: str) -> list[tuple[str, str, str]]:
    """(node type, index or "", index condition or "") for every scan of ``table``."""
    found: list[tuple[str, str, str]] = []
    for node in plan_nodes(plan):
        kind = node["Node Type"]
        if node.get("Relation Name") != table or not kind.endswith("Scan"):
            continue
        index, cond = node.get("Index Name", ""), node.get("Index Cond", "")
        if kind == "Bitmap Heap Scan":  # by the index scans under it
            under = [p for p in node["Plans"] if p["Node Type"] == "Bitmap Index Scan"]
            index = ",".join(p["Index Name"] for p in under)
            cond = "" if len(under) != 1 else under[0].get("Index Cond", "")
        found.append((kind, index, cond))
    return found


async def test_hot_plans_read_runs_by_key_with_stale_statistics(cyclone_env: CycloneEnv) -> None:
    """A long run history analyzed while the queue was empty, then a burst of enqueues that no
    ANALYZE of the history has seen (autovacuum analyzes the small task table long before):
    the statistics know of no pending run. The claim and the outcome writes still reach runs
    only by key, and never sort the history (the claim was planned as a scan of every run,
    then a sort)."""
    pool = cyclone_env.pool
    for table in ("cyclone_runs", "cyclone_tasks", "cyclone_steps", "cyclone_edges"):
        await pool.execute(f"ALTER TABLE {table} SET (autovacuum_enabled = false)")
    await pool.execute(_HISTORY, 30_000)
    await pool.execute("VACUUM ANALYZE")
    for _ in range(5):
        await noop.enqueue_many(cyclone_env.client, list(range(2_000)))
    q = cyclone_env.client._queries
    async with pool.acquire() as conn:
        rows = await db.task_claim(
            conn, q, db.ClaimRequest("plans", ["plan.noop"], 200, 30.0, "w", [])
        )
    run_ids, ids = [r["run_id"] for r in rows], [r["id"] for r in rows]
    claims, n = [r["claims"] for r in rows], len(rows)
    statements: Statements = [
        ("task_claim", ("plans", ["plan.noop"], 16, 30.0, "w", [])),
        ("task_claim", ("plans", ["plan.noop"], 100, 30.0, "w", ["some.flow"])),
        ("task_claim_plain", ("plans", ["plan.noop"], 16, 30.0, "w", [])),
        ("task_claim_plain", ("plans", ["plan.noop"], 100, 30.0, "w", ["some.flow"])),
        ("task_heartbeat", (run_ids, ids, claims, 30.0)),
        ("job_complete_many", (run_ids, ids, claims, ["null"] * n)),
        ("task_retry_many", (run_ids, ids, claims, [0.0] * n, [None] * n, [False] * n)),
        ("task_reclaim", (100, "w")),
        ("job_fail", (run_ids[0], ids[0], 1, "{}", False)),
        ("attempts_completed", (run_ids, [None] * n, ids, claims)),
        ("task_pending_work", (["plan.noop"], [])),
        ("run_lock_many", (run_ids,)),
        ("run_deadline_due", (100,)),
        ("node_advance", (run_ids, ["a"] * n, [False] * n)),
        ("run_purge", (dt.datetime.now(dt.UTC), ["completed"], None, False, 1_000)),
        ("run_purge", (dt.datetime.now(dt.UTC), ["completed"], None, True, 1_000)),
        ("run_purge", (dt.datetime.now(dt.UTC), ["completed"], ["plan.noop"], False, 1_000)),
        ("job_expire", (100,)),
        ("job_discard_many", (run_ids, ids, claims)),
    ]
    # As right after the burst, then once autovacuum has analyzed the task table alone.
    for analyzed in ("nothing", "cyclone_tasks"):
        if analyzed == "cyclone_tasks":
            await pool.execute("ANALYZE cyclone_tasks")
        async for name, _, mode, plan in each_plan(cyclone_env, statements):
            where = (name, analyzed, mode)
            # Runs by key only: never a scan of the history (nor a sort of one).
            for node, index, cond in reads_of(plan, "cyclone_runs"):
                assert node in ("Index Scan", "Bitmap Heap Scan"), (where, node, plan)
                # Pending runs with a deadline; finished runs, oldest first.
                if index not in ("idx_runs_deadline", "idx_runs_finished"):
                    assert index == "cyclone_runs_pkey", (where, index, plan)
                    assert cond.startswith("(id = "), (where, "all runs", plan)
            if name != "task_pending_work":  # a drain's check, which may read them all
                tasks = reads_of(plan, "cyclone_tasks")
                assert all(i for _, i, _ in tasks), (where, "reads every task", tasks)


flow = cyclone.define("plan.flow", int)
flow.node(noop, name="b", after=[flow.node(noop, name="a")])

# Finished runs of plan.flow: a run, two completed steps and the edge between them each.
_FLOW_HISTORY = """
WITH r AS (
    INSERT INTO cyclone_runs
        (id, name, job, state, input, nodes, remaining, created_at, finished_at)
    SELECT gen_random_uuid(), 'plan.flow', false, 'completed', to_jsonb(g.i), 2, 0,
           now() - make_interval(secs => g.i), now() - make_interval(secs => g.i)
    FROM generate_series(1, $1::int) AS g (i)
    RETURNING id, finished_at
), s AS (
    INSERT INTO cyclone_steps
        (run_id, node, kind, queue, priority, max_attempts, state, pending_deps, attempts,
         output, finished_at)
    SELECT r.id, n.node, 'plan.noop', 'plans', 0, 1, 'completed', 0, 1, 'null', r.finished_at
    FROM r, (VALUES ('a'), ('b')) AS n (node)
)
INSERT INTO cyclone_edges (run_id, parent, child) SELECT r.id, 'a', 'b' FROM r
"""


async def test_workflow_plans_read_steps_and_edges_by_key_with_stale_statistics(
    cyclone_env: CycloneEnv,
) -> None:
    """As for runs above, for the workflow tables: a long history of finished steps and
    edges, analyzed, then a burst of workflow runs that no ANALYZE has seen. The claim (a
    node's inputs are its parents' outputs) and every node transition read steps and edges
    only by their run's key, never the history."""
    pool, client = cyclone_env.pool, cyclone_env.client
    for table in ("cyclone_runs", "cyclone_tasks", "cyclone_steps", "cyclone_edges"):
        await pool.execute(f"ALTER TABLE {table} SET (autovacuum_enabled = false)")
    await pool.execute(_FLOW_HISTORY, 20_000)
    await pool.execute("VACUUM ANALYZE")
    for i in range(300):
        await flow.submit(client, i)
    q = client._queries
    async with pool.acquire() as conn:
        # The whole burst: node_advance and the outcome writes planned for a large batch.
        rows = await db.task_claim(
            conn, q, db.ClaimRequest("plans", ["plan.noop"], 300, 30.0, "w", ["plan.flow"])
        )
    assert len(rows) == 300 and all(r["node"] == "a" for r in rows)
    run_ids, ids, n = [r["run_id"] for r in rows], [r["id"] for r in rows], len(rows)
    claims, nodes = [r["claims"] for r in rows], [r["node"] for r in rows]
    error = '{"attempt": 1}'
    kid = uuid.uuid4()  # a child run of the first, as child_insert_many writes one
    statements: Statements = [
        ("task_claim", ("plans", ["plan.noop"], 16, 30.0, "w", ["plan.flow"])),
        ("task_claim_plain", ("plans", ["plan.noop"], 16, 30.0, "w", ["plan.flow"])),
        ("node_complete_many", (run_ids, ids, claims, ["null"] * n)),
        ("node_advance", (run_ids, nodes, [False] * n)),
        ("map_expand", (run_ids, nodes, None)),
        ("map_settle", (run_ids, nodes)),
        ("child_settle", (run_ids,)),
        (
            "child_insert_many",
            (
                *([[v] for v in (kid, "plan.flow", "1", None, "k", 1, None, run_ids[0], "b")]),
                *([[v] for v in (kid, "a", "plan.noop", "plans", 1, 0, None)]),
                [],
                [],
                [],
            ),
        ),
        ("run_children", (run_ids,)),
        ("attempts_completed", (run_ids, nodes, ids, claims)),
        ("attempts_failed", (run_ids, nodes, [error] * n)),
        ("task_retry_many", (run_ids, ids, claims, [0.0] * n, [error] * n, [False] * n)),
        ("node_fail", (run_ids[0], ids[0], claims[0], error, False)),
        ("run_release", (run_ids[0],)),
        ("run_fail", (run_ids[0], error, False)),
        ("run_cancel", (run_ids[0],)),
        ("run_reopen", (run_ids[0], None)),
        ("wait_complete_many", (run_ids, nodes)),
        ("wait_signal", (run_ids[0], "b", "1", None)),
        ("node_get", (run_ids[0], "b")),
        ("wait_expire_due", (100,)),
        ("wait_expire", (run_ids[0], "b", error)),
        ("schedule_next_due", ([], [], None)),
        ("run_status", (run_ids[0],)),
        ("run_result", (run_ids[0],)),
        ("run_nodes", (run_ids[0],)),
        ("run_edges", (run_ids[0],)),
        ("run_purge", (dt.datetime.now(dt.UTC), ["completed"], None, False, 1_000)),
    ]
    by_key = {
        "cyclone_steps": ("cyclone_steps_pkey",),
        "cyclone_edges": ("cyclone_edges_pkey", "idx_edges_child"),
    }
    wrong = []
    async for name, _, mode, plan in each_plan(cyclone_env, statements):
        for table, keys in by_key.items():
            for node, index, cond in reads_of(plan, table):
                if index == "idx_steps_wait_until":  # wait nodes due, by their time
                    continue
                first = cond.lstrip("(")  # "((run_id = ...) AND (node = ...))"
                if index not in keys or not first.startswith("run_id = "):
                    wrong.append((name, mode, table, node, index, cond))
    assert not wrong, "\n".join(map(str, wrong))


async def test_flow_control_plans_with_stale_statistics(cyclone_env: CycloneEnv) -> None:
    """A limited queue's claim (locked rows, running counts, keys in turns) and the flow
    statements read tasks only by index, and runs only by key: analyzed while the queue was
    empty, then a burst of grouped work, then analyzed with it."""
    pool, client = cyclone_env.pool, cyclone_env.client
    for table in ("cyclone_runs", "cyclone_tasks", "cyclone_queues", "cyclone_kind_limits"):
        await pool.execute(f"ALTER TABLE {table} SET (autovacuum_enabled = false)")
    await pool.execute(_HISTORY, 30_000)
    await pool.execute("VACUUM ANALYZE")
    await client.queues.set_limits(
        "plans",
        concurrency=50,
        rate=1000,
        per=1,
        key_concurrency=5,
        key_rate=100,
        key_per=1,
        create=True,
    )
    await client.queues.set_kind_limits("plan.noop", concurrency=40, rate=500, per=1)
    for tenant in range(20):
        await noop.enqueue_many(client, list(range(500)), group=f"t{tenant}")
    await noop.enqueue_many(client, list(range(500)))
    q = client._queries
    async with pool.acquire() as conn:
        rows = await db.task_claim(
            conn, q, db.ClaimRequest("plans", ["plan.noop"], 30, 30.0, "w", [])
        )
    assert len({r["id"] for r in rows}) == len(rows) > 0
    statements: Statements = [
        ("task_claim", ("plans", ["plan.noop"], 16, 30.0, "w", [])),
        ("task_claim", ("elsewhere", ["plan.noop"], 16, 30.0, "w", [])),
        ("task_claim_plain", ("plans", ["plan.noop"], 16, 30.0, "w", [])),
        ("queue_known", ("plans",)),
        ("queue_list", (None,)),
        ("queue_limits_set", ("plans", 10, None, None, None, None, None)),
        ("queue_pause_set", ("plans", False)),
        ("kind_limits_set", ("plan.noop", 10, None, None)),
    ]
    for analyzed in ("nothing", "everything"):
        if analyzed == "everything":
            await pool.execute("ANALYZE")
        async for name, args, mode, plan in each_plan(cyclone_env, statements):
            where = (name, analyzed, mode)
            for node, index, cond in reads_of(plan, "cyclone_runs"):
                assert index == "cyclone_runs_pkey", (where, node, plan)
                assert cond.startswith("(id = "), (where, "all runs", plan)
            tasks = reads_of(plan, "cyclone_tasks")
            assert all(i for _, i, _ in tasks), (where, "reads every task", tasks)
            if args[0] == "plans" and name == "task_claim":
                used = {i for _, i, _ in tasks}
                assert {"idx_tasks_claim", "idx_tasks_lease"} <= used, (where, used)


def runs_of(plan: object, index: str) -> list[int]:
    """The loops of every scan of ``index`` (or of the table so named, by any path) in an
    analyzed plan (0: that branch never ran)."""
    return [
        node["Actual Loops"]
        for node in plan_nodes(plan)
        if index in (node.get("Index Name"), node.get("Relation Name"))
        and "Scan" in node["Node Type"]
    ]


async def test_a_claim_without_limits_or_keys_counts_nothing(cyclone_env: CycloneEnv) -> None:
    """A queue with no limits and no keyed work: its claim probes the claim index once for
    group keys and once for its tasks, and never counts running tasks (the lease index) nor
    reads the per-key starts log, whatever runs. Beside it, a limited queue with keys counts
    them (the same statement: the branches are chosen as it runs)."""
    client, pool, q = cyclone_env.client, cyclone_env.pool, cyclone_env.client._queries
    await noop.enqueue_many(client, list(range(2_000)))
    async with pool.acquire() as conn:  # some running already, as a limit would count them
        assert (
            len(
                await db.task_claim(
                    conn, q, db.ClaimRequest("plans", ["plan.noop"], 20, 30.0, "w", [])
                )
            )
            == 20
        )
    await pool.execute("ANALYZE")

    async def analyzed(queue: str) -> object:
        async with pool.acquire() as conn:
            tx = conn.transaction()
            await tx.start()
            try:
                text = await conn.fetchval(
                    f"EXPLAIN (ANALYZE, FORMAT JSON) {q['task_claim']}",
                    queue,
                    ["plan.noop"],
                    10,
                    30.0,
                    "w",
                    [],
                )
            finally:
                await tx.rollback()
        return json.loads(text)

    plan = await analyzed("plans")
    assert sum(runs_of(plan, "idx_tasks_claim")) == 2, runs_of(plan, "idx_tasks_claim")
    assert sum(runs_of(plan, "idx_tasks_lease")) == 0
    assert sum(runs_of(plan, "cyclone_key_starts")) == 0
    await client.queues.set_limits(
        "keyed", concurrency=50, key_concurrency=5, key_rate=100, key_per=1, create=True
    )
    for tenant in range(3):
        await noop.enqueue_many(client, list(range(20)), group=f"t{tenant}", queue="keyed")
    plan = await analyzed("keyed")
    assert sum(runs_of(plan, "idx_tasks_lease")) >= 2  # the queue's running, and by key
    assert sum(runs_of(plan, "idx_tasks_claim")) >= 1 + 3 + 3  # probes, and each key's tasks
    assert sum(runs_of(plan, "cyclone_key_starts")) >= 1


@pytest.mark.parametrize("claim", ["task_claim", "task_claim_plain"])
async def test_a_long_backlog_does_not_make_the_claim_costly_enough_to_compile(
    cyclone_env: CycloneEnv, claim: str
) -> None:
    """PostgreSQL compiles a statement whose estimated cost passes jit_above_cost (100,000 by
    default) on every execution. The claim's share of a key is a limit the planner cannot
    know, which it costs as a tenth of all available tasks: a backlog of 50,000 crossed the
    line and each claim spent about 120 ms compiling (1.9 s at 200,000). Its scan is capped
    by CLAIM_MAX, so its cost no longer grows with the backlog."""
    client, pool = cyclone_env.client, cyclone_env.pool
    for _ in range(10):
        await noop.enqueue_many(client, list(range(10_000)))
    await pool.execute("ANALYZE")
    async with pool.acquire() as conn:
        await conn.execute("SET jit = on; SET jit_above_cost = 100000")
        for mode in ("custom", "generic"):
            await conn.execute(f"SET plan_cache_mode = force_{mode}_plan")
            statement = await conn.prepare(f"EXPLAIN (FORMAT JSON) {client._queries[claim]}")
            for limit in (16, db.CLAIM_MAX):
                plan = json.loads(
                    await statement.fetchval("plans", ["plan.noop"], limit, 30.0, "w", [])
                )
                assert plan[0]["Plan"]["Total Cost"] < 100_000, (mode, limit, plan)
        async with conn.transaction():
            text = await conn.fetchval(
                f"EXPLAIN (ANALYZE, FORMAT JSON) {client._queries[claim]}",
                *("plans", ["plan.noop"], 16, 30.0, "w", []),
            )
            assert "JIT" not in json.loads(text)[0]


@pytest.mark.parametrize("claim", [db.task_claim, db.task_claim_plain])
async def test_a_claim_locks_only_what_it_takes_under_the_cap(
    cyclone_env: CycloneEnv, claim: Callable[..., Awaitable[db.ClaimedRows]]
) -> None:
    """The constant CLAIM_MAX limit sits under the claim's share: a claim of 5, its
    transaction still open, locks those 5 tasks and no more of the 20 its capped scan could
    read, and a claim beside it takes 5 others."""
    client, pool = cyclone_env.client, cyclone_env.pool

    def take(limit: int, worker: str) -> db.ClaimRequest:
        return db.ClaimRequest("plans", [noop.name], limit, 30.0, worker, [])

    await noop.enqueue_many(client, list(range(20)))
    unlocked = "SELECT count(*) FROM (SELECT 1 FROM cyclone_tasks FOR UPDATE SKIP LOCKED) t"
    async with pool.acquire() as first, pool.acquire() as second, first.transaction():
        mine = await claim(first, client._queries, take(5, "a"))
        async with second.transaction():
            assert await second.fetchval(unlocked) == 15
        theirs = await claim(second, client._queries, take(5, "b"))
    assert len(mine) == len(theirs) == 5
    assert {r["id"] for r in mine}.isdisjoint({r["id"] for r in theirs})


async def test_the_claims_settle_on_their_cached_generic_plans(cyclone_env: CycloneEnv) -> None:
    """After a connection's first five claims, each claim statement runs its cached generic
    plan instead of being planned again (which took longer than running it): its custom plans
    are costed no cheaper than the generic one. A plain claim with its limit as a parameter
    was planned on every execution."""
    client, pool = cyclone_env.client, cyclone_env.pool
    await noop.enqueue_many(client, list(range(1_000)))
    await pool.execute("ANALYZE")
    q = client._queries
    async with pool.acquire() as conn:
        for _ in range(20):
            assert len(
                await db.task_claim_plain(
                    conn, q, db.ClaimRequest("plans", [noop.name], 10, 30, "w", [])
                )
            )
            assert len(
                await db.task_claim(
                    conn, q, db.ClaimRequest("plans", [noop.name], 10, 30.0, "w", [])
                )
            )
        rows = await conn.fetch(
            "SELECT substring(statement from '^-- cyclone: (\\w+)') AS name,"
            " generic_plans, custom_plans FROM pg_prepared_statements"
        )
    plans = {r["name"]: (r["generic_plans"], r["custom_plans"]) for r in rows if r["name"]}
    for name in ("task_claim_plain", "task_claim"):
        generic, custom = plans[name]
        assert custom <= 5 and generic >= 15, (name, generic, custom)


flow = cyclone.define("plan.flow", int)
flow.node(noop, name="b", after=[flow.node(noop, name="a")])


def repeated_array_scans(plan: object) -> list[tuple[str, str, int, str]]:
    """Scans that test a row against a whole batch (an ``= ANY`` condition) once per row of
    another input: (node, table, loops, condition). Each repeats the batch's reads, so the
    statement costs O(batch²)."""
    found = []
    for node in plan_nodes(plan):
        conds = " ".join(str(node.get(k, "")) for k in ("Index Cond", "Filter", "Recheck Cond"))
        if "ANY" in conds and node.get("Actual Loops", 1) > 1:
            table = node.get("Relation Name", "")
            found.append((node["Node Type"], table, node["Actual Loops"], conds.strip()))
    return found


async def test_outcome_batches_cost_linearly(cyclone_env: CycloneEnv) -> None:
    """A batch of 64 outcomes (of 2,000 jobs and 200 workflow runs) reads each run or step
    row it writes once: the completion of
    jobs probed the batch's runs once per completed task (a nested loop over the index scan
    by ``id = ANY``: 64 x 64 probes), and the completion of nodes, the advance of their runs
    and the parking of retries scanned the steps per row likewise."""
    client, pool, q = cyclone_env.client, cyclone_env.pool, cyclone_env.client._queries
    for i in range(200):  # first: the first claim serving the workflow takes its nodes
        await flow.submit(client, i)
    await noop.enqueue_many(client, list(range(2_000)))
    await pool.execute("VACUUM ANALYZE")

    async def analyzed(name: str, **params: object) -> object:
        """The plan of ``name`` as it ran, its writes rolled back."""
        sql, args = q.bind(name, params)
        async with pool.acquire() as conn:
            tx = conn.transaction()
            await tx.start()
            try:
                return json.loads(
                    await conn.fetchval(f"EXPLAIN (ANALYZE, FORMAT JSON) {sql}", *args)
                )
            finally:
                await tx.rollback()

    async with pool.acquire() as conn:
        nodes = await db.task_claim_plain(
            conn, q, db.ClaimRequest("plans", ["plan.noop"], 64, 30.0, "w", ["plan.flow"])
        )
        jobs = await db.task_claim_plain(
            conn, q, db.ClaimRequest("plans", ["plan.noop"], 64, 30.0, "w", [])
        )
    assert len(jobs) == 64 and len(nodes) == 64 and all(r["node"] for r in nodes)
    assert not any(r["node"] for r in jobs)
    # The nodes' completion advances their runs: children counted down by key, not by the
    # batch once per child (it took 6 to 12 ms for 100 nodes, 37 to 73 for 400).
    batch = {"run_ids": [r["run_id"] for r in nodes], "nodes": [r["node"] for r in nodes]}
    for name, extra in [
        ("node_advance", {"skipped": [False] * 64}),
        ("map_expand", {"available_at": None}),
        ("map_settle", {}),
    ]:
        repeated = repeated_array_scans(await analyzed(name, **batch, **extra))
        assert repeated == [], (name, repeated)
    for name, rows, extra in [
        ("job_complete_many", jobs, {"outputs": ["null"] * 64}),
        ("node_complete_many", nodes, {"outputs": ["null"] * 64}),
        (
            "task_retry_many",
            nodes,
            {"delays": [0.0] * 64, "errors": [None] * 64, "refunds": [False] * 64},
        ),
    ]:
        keys = {
            "run_ids": [r["run_id"] for r in rows],
            "ids": [r["id"] for r in rows],
            "claims": [r["claims"] for r in rows],
        }
        if name == "task_retry_many":  # their runs failed meanwhile: the nodes are parked
            await pool.execute(
                "UPDATE cyclone_runs SET state = 'failed' WHERE id = ANY ($1)", keys["run_ids"]
            )
        repeated = repeated_array_scans(await analyzed(name, **keys, **extra))
        assert repeated == [], (name, repeated)
