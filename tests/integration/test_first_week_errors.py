"""What a newcomer meets on a real database: every call on a schema that lacks Cyclone's
tables (or one of its migrations) says to migrate, with the driver's error as its cause;
a kind given by name is refused before anything is written; a failed run's error says its
cause in a line."""

from __future__ import annotations

import asyncio
import uuid
from typing import Annotated

import asyncpg
import msgspec
import psycopg_pool
import pytest

import cyclone
from cyclone.testing.plugin import CycloneEnv
from tests.conftest import count_rows


@cyclone.step("first_week.add")
async def add(ctx: cyclone.Context, n: int) -> int:
    return n + 1


@cyclone.step("first_week.boom", max_attempts=2)
async def boom(ctx: cyclone.Context, n: int) -> int:
    raise ValueError(f"boom {n}")


flow = cyclone.define("first_week.flow", int)
flow.node(add)

NOT_MIGRATED = (
    "schema 'nothing_here' lacks Cyclone migrations this version of cyclone-pg needs "
    '(relation "nothing_here.cyclone_runs" does not exist): run `cyclone migrate` (or '
    "`await client.migrate()`)"
)


def assert_not_migrated(raised: pytest.ExceptionInfo[cyclone.SchemaNotMigratedError]) -> None:
    assert str(raised.value) == NOT_MIGRATED
    assert isinstance(raised.value.__cause__, asyncpg.UndefinedTableError)
    assert raised.value.schema == "nothing_here" and raised.value.missing == []


async def test_calls_on_an_unmigrated_schema_say_to_migrate(cyclone_env: CycloneEnv) -> None:
    client = cyclone.Client(cyclone_env.pool, schema="nothing_here")
    calls = [
        lambda: add.enqueue(client, 1),
        lambda: cyclone.enqueue(client, add, 1),
        lambda: add.enqueue_many(client, [1, 2]),
        lambda: flow.submit(client, 1),
        lambda: flow.submit_once(client, "k", 1),
        lambda: client.list_runs(),
        lambda: client.get_run(uuid.uuid4()),
    ]
    for call in calls:
        with pytest.raises(cyclone.SchemaNotMigratedError) as raised:
            await call()
        assert_not_migrated(raised)


async def test_a_caller_transaction_on_an_unmigrated_schema(cyclone_env: CycloneEnv) -> None:
    """The failed statement aborts the caller's transaction, as any failed statement does:
    the error says to migrate, and the transaction can only be rolled back."""
    client = cyclone.Client(cyclone_env.pool, schema="nothing_here")
    for call in (
        lambda conn: add.enqueue_tx(client, conn, 1),
        lambda conn: cyclone.enqueue_many_tx(client, conn, add, [1]),
        lambda conn: cyclone.submit_tx(client, conn, flow, 1),
    ):
        async with cyclone_env.pool.acquire() as conn:
            tx = conn.transaction()
            await tx.start()
            with pytest.raises(cyclone.SchemaNotMigratedError) as raised:
                await call(conn)
            assert_not_migrated(raised)
            with pytest.raises(asyncpg.InFailedSQLTransactionError):
                await conn.fetchval("SELECT 1")
            await tx.rollback()


GROUPS_MIGRATION = 8  # 0008: cyclone_runs.group_key


async def test_a_schema_that_lacks_a_newer_migration_says_to_migrate(
    cyclone_env: CycloneEnv,
) -> None:
    """The tables exist but a column a later migration adds does not (the group column)."""
    client = cyclone.Client(cyclone_env.pool, schema="older")
    latest = client._queries.migrations
    # As an install of the version before the group column came.
    client._queries.migrations = tuple(m for m in latest if m.version < GROUPS_MIGRATION)
    await client.migrate()
    client._queries.migrations = latest
    with pytest.raises(cyclone.SchemaNotMigratedError):  # its inserts need its own schema
        await add.enqueue(client, 1)
    with pytest.raises(cyclone.SchemaNotMigratedError) as raised:
        await add.enqueue(client, 1, group="tenant-1")
    assert str(raised.value).startswith(
        "schema 'older' lacks Cyclone migrations this version of cyclone-pg needs (column "
    )
    assert str(raised.value).endswith(": run `cyclone migrate` (or `await client.migrate()`)")
    assert isinstance(raised.value.__cause__, asyncpg.UndefinedColumnError)
    await client.migrate()
    await add.enqueue(client, 1, group="tenant-1")


async def test_other_missing_objects_stay_the_drivers_errors(cyclone_env: CycloneEnv) -> None:
    """A missing table of the caller's, in the caller's own statement of the same
    transaction, is the caller's: Cyclone translates only its own statements."""
    async with cyclone_env.pool.acquire() as conn, conn.transaction():
        await add.enqueue_tx(cyclone_env.client, conn, 1)
        with pytest.raises(asyncpg.UndefinedTableError):
            await conn.execute("SELECT * FROM no_such_orders")


def test_the_synchronous_client_says_to_migrate(cyclone_env: CycloneEnv) -> None:
    with psycopg_pool.ConnectionPool(cyclone_env.dsn, min_size=1, max_size=2) as pool:
        client = cyclone.sync.Client(pool, schema="nothing_here")
        with pytest.raises(cyclone.SchemaNotMigratedError) as raised:
            client.enqueue(add, 1)
        assert str(raised.value) == NOT_MIGRATED
        with pytest.raises(cyclone.SchemaNotMigratedError):
            client.list_runs()


async def test_enqueue_by_kind_name_is_refused_and_writes_nothing(
    cyclone_env: CycloneEnv,
) -> None:
    client = cyclone_env.client
    with pytest.raises(cyclone.InvalidInputError) as raised:
        await cyclone.enqueue(client, "demo.unknown", 1)  # type: ignore[arg-type]
    assert str(raised.value).startswith(
        "cyclone.enqueue() takes a step (from @cyclone.step or @cyclone.action) or a kind from "
        "cyclone.register_kind(...), got str 'demo.unknown'"
    )
    async with cyclone_env.pool.acquire() as conn, conn.transaction():
        with pytest.raises(cyclone.InvalidInputError, match=r"^cyclone\.enqueue_tx\(\) takes"):
            await cyclone.enqueue_tx(client, conn, "demo.unknown", 1)  # type: ignore[arg-type]
        assert await conn.fetchval("SELECT 1") == 1  # the transaction is still usable
    assert await count_rows(cyclone_env, "cyclone_runs") == 0


async def test_a_failed_run_says_its_cause_in_a_line(cyclone_env: CycloneEnv) -> None:
    run = await boom.enqueue(cyclone_env.client, 7)
    async with asyncio.timeout(60):
        async with cyclone_env.worker(steps=[boom]) as worker:
            assert await run.wait(timeout=60) is cyclone.RunState.FAILED
            await worker.drain()
    with pytest.raises(cyclone.RunFailedError) as raised:
        await run.result()
    assert str(raised.value) == f"run {run.id} failed: ValueError: boom 7 (attempt 2)"
    assert raised.value.error["message"] == "boom 7"
    assert raised.value.traceback is not None
    assert "raise ValueError" in raised.value.traceback
    assert raised.value.traceback == raised.value.error["traceback"]


@cyclone.step("first.counted")
async def counted(ctx: cyclone.Context, n: Annotated[int, msgspec.Meta(ge=0)]) -> int:
    return n


async def test_a_constraint_on_an_input_is_checked_at_enqueue(cyclone_env: CycloneEnv) -> None:
    """``Annotated[int, msgspec.Meta(ge=0)]`` keeps its constraint: a negative input is
    refused before anything is written, and a valid one runs."""
    with pytest.raises(cyclone.InvalidInputError, match=r"input of step 'first\.counted'"):
        await counted.enqueue(cyclone_env.client, -1)
    assert await cyclone_env.pool.fetchval("SELECT count(*) FROM cyclone_runs") == 0
    run = await counted.enqueue(cyclone_env.client, 3)
    await cyclone_env.drain(steps=[counted])
    assert await run.result(timeout=10) == 3
