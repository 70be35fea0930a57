"""The client: migrations, schemas, listing runs, round trips, surviving dropped connections."""

from __future__ import annotations

import asyncio
import datetime as dt
import uuid

import asyncpg
import pytest

import cyclone
from cyclone._model.ids import uuid7
from cyclone._storage.loader import MIGRATIONS
from cyclone._storage.queries import DATABASE_ERRORS
from cyclone.testing.plugin import CycloneEnv
from tests.conftest import fast_worker, recording_queries, waiting_on_a_lock


@cyclone.step("client.echo")
async def echo(ctx: cyclone.Context, n: int) -> int:
    return n


async def test_concurrent_migrations_apply_once(cyclone_env: CycloneEnv) -> None:
    pools = [await asyncpg.create_pool(cyclone_env.dsn, min_size=1, max_size=1) for _ in range(5)]
    try:
        clients = [cyclone.Client(p, schema="tenant_a") for p in pools]
        applied = await asyncio.gather(*(c.migrate() for c in clients))
    finally:
        for pool in pools:
            await pool.close()
    assert sorted(applied) == [[], [], [], [], [m.version for m in MIGRATIONS]]
    assert await cyclone.Client(cyclone_env.pool, schema="tenant_a").migrate() == []


async def jobs_as_of_0002(pool: asyncpg.Pool, schema: str, inputs: list[int]) -> list[uuid.UUID]:
    """Jobs of ``echo`` written as a release of migration 0002 wrote them: this release's
    inserts need its own schema (cyclone/_storage/sql/README.md, "Schema generations")."""
    ids = [uuid7() for _ in inputs]
    await pool.execute(
        f"""WITH run AS (
            INSERT INTO {schema}.cyclone_runs
                (id, name, job, input, queue, nodes, remaining, max_attempts)
            SELECT i.id, $3, true, to_jsonb(i.n), $4, 1, 1, $5
            FROM unnest($1::uuid[], $2::int[]) AS i (id, n)
        )
        INSERT INTO {schema}.cyclone_tasks (run_id, kind, queue, max_attempts)
        SELECT i.id, $3, $4, $5 FROM unnest($1::uuid[]) WITH ORDINALITY AS i (id, ord)
        ORDER BY i.ord""",
        ids,
        inputs,
        echo.name,
        echo.queue,
        echo.max_attempts,
    )
    return ids


async def test_upgrading_keeps_live_work(cyclone_env: CycloneEnv) -> None:
    """Work enqueued before a migration is claimed and completed after it."""
    client = cyclone.Client(cyclone_env.pool, schema="upgraded")
    latest = client._queries.migrations
    client._queries.migrations = latest[:2]  # as an install of the version before 0003
    assert await client.migrate() == [1, 2]
    ids = await jobs_as_of_0002(cyclone_env.pool, "upgraded", [1, 2, 3])
    client._queries.migrations = latest
    assert await client.migrate() == [m.version for m in latest[2:]]
    runs = [await client.get_run(i, int) for i in ids]
    async with fast_worker(client, steps=[echo]):
        assert [await r.result(timeout=30) for r in runs] == [1, 2, 3]


async def test_upgrading_beside_a_live_workflow_transition(cyclone_env: CycloneEnv) -> None:
    """A worker still running (a workflow transition: the run row, then its tasks) while
    another process migrates: neither deadlocks; the migration waits its turn."""
    client = cyclone.Client(cyclone_env.pool, schema="live")
    latest = client._queries.migrations
    client._queries.migrations = latest[:2]
    await client.migrate()
    [run_id] = await jobs_as_of_0002(cyclone_env.pool, "live", [1])
    client._queries.migrations = latest
    worker = await asyncpg.connect(cyclone_env.dsn)
    try:
        transition = worker.transaction()
        await transition.start()
        await worker.execute("SELECT id FROM live.cyclone_runs WHERE id = $1 FOR UPDATE", run_id)
        migrating = asyncio.get_running_loop().create_task(client.migrate())
        await waiting_on_a_lock(cyclone_env)  # the migration waits for the run's lock
        await worker.execute("DELETE FROM live.cyclone_tasks WHERE run_id = $1", run_id)
        await transition.commit()
        assert await asyncio.wait_for(migrating, 30) == [m.version for m in latest[2:]]
    finally:
        await worker.close()


async def test_a_schema_of_its_own(cyclone_env: CycloneEnv) -> None:
    tenant = cyclone.Client(cyclone_env.pool, schema="tenant_b")
    await tenant.migrate()
    run = await echo.enqueue(tenant, 5)
    async with fast_worker(tenant, steps=[echo]):
        assert await run.result(timeout=30) == 5
    # The public schema's tables never saw it.
    assert await cyclone_env.pool.fetchval("SELECT count(*) FROM public.cyclone_runs") == 0
    assert await cyclone_env.pool.fetchval("SELECT count(*) FROM tenant_b.cyclone_runs") == 1
    with pytest.raises(cyclone.RunNotFoundError):
        await cyclone_env.client.get_run(run.id)


@pytest.mark.parametrize("schema", ["", "Upper", "bad-name", "x" * 64, "a;drop"])
def test_schema_names_are_validated(cyclone_env: CycloneEnv, schema: str) -> None:
    with pytest.raises(ValueError):
        cyclone.Client(cyclone_env.pool, schema=schema)


def test_client_needs_a_pool() -> None:
    with pytest.raises(cyclone.InvalidInputError):
        cyclone.Client("postgresql://nowhere")  # type: ignore[arg-type]


async def test_list_runs_filters_and_pages(cyclone_env: CycloneEnv) -> None:
    client = cyclone_env.client
    wf = cyclone.define("listed", int)
    wf.node(echo)
    jobs = await echo.enqueue_many(client, list(range(5)))
    keyed, _ = await wf.submit_once(client, "the-key", 1)
    cancelled = await echo.enqueue(client, 99)
    await cancelled.cancel()

    everything = await client.list_runs()
    assert [r.id for r in everything.runs] == sorted(
        [r.id for r in [*jobs, keyed, cancelled]], reverse=True
    )  # newest first
    assert everything.next_cursor is None

    by_name = await client.list_runs(cyclone.RunQuery(name="listed"))
    assert [r.id for r in by_name.runs] == [keyed.id]
    assert (await client.list_runs(cyclone.RunQuery(key="the-key"))).runs[0].id == keyed.id
    states = await client.list_runs(cyclone.RunQuery(state=cyclone.RunState.CANCELLED))
    assert [r.id for r in states.runs] == [cancelled.id]
    several = await client.list_runs(
        cyclone.RunQuery(state=[cyclone.RunState.CANCELLED, cyclone.RunState.PENDING])
    )
    assert len(several.runs) == 7

    seen = []
    query = cyclone.RunQuery(name="client.echo", limit=2)
    while True:
        page = await client.list_runs(query)
        assert len(page.runs) <= 2
        seen += [r.id for r in page.runs]
        if page.next_cursor is None:
            break
        query = cyclone.RunQuery(name="client.echo", limit=2, cursor=page.next_cursor)
    assert seen == sorted([r.id for r in [*jobs, cancelled]], reverse=True)

    now = dt.datetime.now(dt.UTC)
    assert (await client.list_runs(cyclone.RunQuery(created_after=now))).runs == []
    assert len((await client.list_runs(cyclone.RunQuery(created_before=now))).runs) == 7
    with pytest.raises(cyclone.InvalidInputError):
        await client.list_runs(cyclone.RunQuery(cursor="not-a-cursor"))
    with pytest.raises(cyclone.InvalidInputError):
        await client.list_runs(cyclone.RunQuery(limit=0))


async def test_running_state_is_reported(cyclone_env: CycloneEnv) -> None:
    run = await echo.enqueue(cyclone_env.client, 1)
    await cyclone_env.pool.execute(
        "UPDATE cyclone_tasks SET state = 'running', attempt = 1, lease_until = now() + '1 h'"
    )
    page = await cyclone_env.client.list_runs(cyclone.RunQuery(state=cyclone.RunState.RUNNING))
    assert [r.id for r in page.runs] == [run.id]
    assert await run.status() is cyclone.RunState.RUNNING
    # Listing pending runs filters on the same reported state: a running run is not pending.
    waiting = await echo.enqueue(cyclone_env.client, 2)
    page = await cyclone_env.client.list_runs(cyclone.RunQuery(state=cyclone.RunState.PENDING))
    assert [r.id for r in page.runs] == [waiting.id]


async def test_enqueue_many_is_one_statement(cyclone_env: CycloneEnv) -> None:
    async with (
        cyclone_env.pool.acquire() as conn,
        recording_queries(conn) as sent,
        conn.transaction(),
    ):
        await echo.enqueue_many_tx(cyclone_env.client, conn, list(range(500)))
        wf = cyclone.define("wide", int)
        root = wf.node(echo, name="root")
        for i in range(50):
            wf.node(echo, name=f"n{i}", after=[root])
        await wf.submit_tx(cyclone_env.client, conn, 1)
    # One for 500 jobs, one for a run with 51 nodes and 50 edges (and on Citus, the layout
    # read once, then per call the mark that has Citus commit the transaction in two phases).
    inserts = [s for s in sent if "-- cyclone: layout_" not in s]
    assert len(inserts) == 2
    assert await cyclone_env.pool.fetchval("SELECT count(*) FROM cyclone_runs") == 501


async def test_worker_and_client_survive_dropped_connections(cyclone_env: CycloneEnv) -> None:
    client = cyclone_env.client
    async with fast_worker(client, steps=[echo]):
        await asyncio.wait_for(client.services.notifier.connected.wait(), 30)
        first = await echo.enqueue(client, 1)
        assert await first.result(timeout=30) == 1
        # Drop every other session, as a failover or a restarted proxy would.
        admin = await asyncpg.connect(cyclone_env.dsn)
        try:
            dropped = await admin.fetchval(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
                " WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
        finally:
            await admin.close()
        assert dropped >= 2  # the pool's connections and the LISTEN connection
        second = None
        async with asyncio.timeout(60):
            while second is None:
                try:
                    second = await echo.enqueue(client, 2)
                except DATABASE_ERRORS:
                    # A pooled connection that died fails its next statement, once.
                    await asyncio.sleep(0.05)
        assert await second.result(timeout=60) == 2
        await asyncio.wait_for(client.services.notifier.connected.wait(), 60)  # it reconnected


async def test_unique_enqueue_needs_no_transaction(cyclone_env: CycloneEnv) -> None:
    """A unique= enqueue is one statement, or two when the key is held (the holder's id):
    no BEGIN/COMMIT round trips. Only a sequence= enqueue needs a transaction."""
    pool = await asyncpg.create_pool(cyclone_env.dsn, min_size=1, max_size=1)
    sent: list[str] = []

    def began() -> bool:
        return any(q.strip().upper().startswith("BEGIN") for q in sent)

    try:
        client = cyclone.Client(pool)
        async with pool.acquire() as conn:  # the pool's one connection
            conn.add_query_logger(lambda record: sent.append(record.query))
        first = await echo.enqueue(client, 1, unique="nightly")
        with pytest.raises(cyclone.DuplicateError) as raised:
            await echo.enqueue(client, 2, unique="nightly")
        assert raised.value.run_id == first.id
        assert not began()
        await echo.enqueue(client, 3, sequence="s")
        assert began()
        await client.aclose()
    finally:
        await pool.close()
