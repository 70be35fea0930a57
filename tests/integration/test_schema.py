"""The schema the migrations build: exactly these tables and indexes, nothing stray."""

from __future__ import annotations

import re

import asyncpg
import pytest

import cyclone
from cyclone.testing.plugin import CycloneEnv

TABLES = {
    "cyclone_runs",
    "cyclone_steps",
    "cyclone_edges",
    "cyclone_tasks",
    "cyclone_workers",
    "cyclone_schedules",
    "cyclone_migrations",
    "cyclone_queues",  # 0008_flow_control
    "cyclone_kind_limits",
    "cyclone_key_starts",
    "cyclone_retention",  # 0012_expiry_retention
    "cyclone_throttles",  # 0013_debounce
    "cyclone_streams",  # 0017_streams
    "cyclone_progress",
}
INDEXES = {
    "cyclone_runs_pkey",
    "idx_runs_submit_key",
    "idx_runs_unique_key",
    "idx_runs_deadline",
    "idx_runs_parent",
    "idx_runs_finished",
    "cyclone_steps_pkey",
    "idx_steps_wait_until",
    "idx_steps_finished",
    "cyclone_edges_pkey",
    "idx_edges_child",
    "cyclone_tasks_pkey",
    "idx_tasks_claim",
    "idx_tasks_lease",
    "idx_tasks_sequence",
    "idx_tasks_expires",  # 0012_expiry_retention
    "cyclone_workers_pkey",
    "idx_workers_expires",
    "cyclone_migrations_pkey",
    "cyclone_schedules_pkey",  # 0007_schedules
    "cyclone_queues_pkey",  # 0008_flow_control
    "cyclone_kind_limits_pkey",
    "idx_key_starts",
    "cyclone_retention_pkey",  # 0012_expiry_retention
    "idx_tasks_debounce",  # 0013_debounce
    "cyclone_throttles_pkey",
    "idx_runs_forked",  # 0014_fork
    "cyclone_streams_pkey",  # 0017_streams
    "cyclone_progress_pkey",
}


@cyclone.step("schema.noop")
async def noop(ctx: cyclone.Context, n: int) -> None:
    return None


async def test_migrated_schema(cyclone_env: CycloneEnv, request: pytest.FixtureRequest) -> None:
    tables = {
        r["tablename"]
        for r in await cyclone_env.pool.fetch(
            "SELECT tablename FROM pg_tables WHERE schemaname = 'public'"
        )
    }
    if request.config.getoption("--citus"):  # the two-phase mark's table, and its shard
        marks = {t for t in tables if re.fullmatch(r"cyclone_two_phase(_\d+)?", t)}
        assert "cyclone_two_phase" in marks
        tables -= marks
    assert tables == TABLES
    indexes = {
        r["indexname"]
        for r in await cyclone_env.pool.fetch(
            "SELECT indexname FROM pg_indexes WHERE schemaname = 'public'"
        )
    }
    assert indexes == INDEXES
    # The claim index holds live, claimable rows only.
    claim = await cyclone_env.pool.fetchval(
        "SELECT indexdef FROM pg_indexes WHERE indexname = 'idx_tasks_claim'"
    )
    assert claim.endswith("WHERE (state = 'available'::text)")
    # The hot table is vacuumed eagerly.
    options = await cyclone_env.pool.fetchval(
        "SELECT reloptions FROM pg_class WHERE relname = 'cyclone_tasks'"
    )
    assert "autovacuum_vacuum_scale_factor=0.01" in options
    # A task is found by its run and id together; one key serves both look-ups.
    key = await cyclone_env.pool.fetchval(
        "SELECT indexdef FROM pg_indexes WHERE indexname = 'cyclone_tasks_pkey'"
    )
    assert key.endswith("(run_id, id)")
    # A task has a lease exactly while it runs; the lease index covers leased tasks.
    lease = await cyclone_env.pool.fetchval(
        "SELECT indexdef FROM pg_indexes WHERE indexname = 'idx_tasks_lease'"
    )
    assert lease.endswith("WHERE (lease_until IS NOT NULL)")
    await noop.enqueue(cyclone_env.client, 1)
    with pytest.raises(asyncpg.CheckViolationError):
        await cyclone_env.pool.execute("UPDATE cyclone_tasks SET state = 'running'")
    with pytest.raises(asyncpg.CheckViolationError):
        await cyclone_env.pool.execute("UPDATE cyclone_tasks SET lease_until = now()")
