"""Retention per kind or workflow, and kinds that keep nothing once completed: a name's own
retention replaces the client's for its runs, the client's sweep leaves such a name alone
(whichever worker runs it), and a completed job of a keep-nothing kind leaves no row while
its failures stay. Also: migration 0012 on a schema at 0011 with rows in it."""

from __future__ import annotations

import datetime as dt
import uuid

import asyncpg
import pytest

import cyclone
from cyclone._model.retention import Retentions
from cyclone._worker import maintenance
from cyclone.testing.plugin import CycloneEnv
from tests.conftest import count_rows, migrated_to

SOON = dt.timedelta(microseconds=1)  # purged at the first pass after the run ends
FOREVER = cyclone.Retention()


@cyclone.step("ret.own", queue="ret", retention=cyclone.Retention(completed=SOON))
async def own(ctx: cyclone.Context, n: int) -> int:
    return n


@cyclone.step("ret.kept", queue="ret", retention=FOREVER)
async def kept(ctx: cyclone.Context, n: int) -> int:
    return n


@cyclone.step("ret.plain", queue="ret")
async def plain(ctx: cyclone.Context, n: int) -> int:
    return n


@cyclone.action(
    "ret.nothing",
    queue="ret",
    max_attempts=1,
    retention=cyclone.Retention(completed=cyclone.KEEP_NOTHING),
)
async def nothing(ctx: cyclone.Context, n: int) -> None:
    if n < 0:
        raise ValueError("negative")


flow = cyclone.define("ret.flow", int, retention=cyclone.Retention(completed=SOON))
flow.node(plain, name="only")


async def _names(env: CycloneEnv) -> list[str]:
    rows = await env.pool.fetch("SELECT name FROM cyclone_runs ORDER BY name")
    return [r["name"] for r in rows]


async def test_a_kinds_retention_purges_its_runs_only(cyclone_env: CycloneEnv) -> None:
    client = cyclone_env.client  # no client-wide retention: only ret.own and ret.flow go
    for step in (own, kept, plain):
        await step.enqueue(client, 1)
    await flow.submit(client, 1)
    # No pass of the draining worker's own (a slow drain would outlast its interval): the
    # only purge is the one below.
    await cyclone_env.drain(steps=[own, kept, plain], workflows=[flow], maintenance_interval=3600)
    assert await _names(cyclone_env) == ["ret.flow", "ret.kept", "ret.own", "ret.plain"]
    await cyclone_env.worker(steps=[own, kept, plain], workflows=[flow]).maintain_once()
    assert await _names(cyclone_env) == ["ret.kept", "ret.plain"]


async def test_the_clients_sweep_leaves_names_with_their_own_alone(
    cyclone_env: CycloneEnv,
) -> None:
    """A worker that defines ret.kept records its retention (kept forever); another worker
    that does not know the name sweeps by the client's retention and leaves it alone."""
    client = cyclone.Client(cyclone_env.pool, retention=cyclone.Retention(completed=SOON))
    await kept.enqueue(client, 1)
    await plain.enqueue(client, 2)
    await cyclone_env.drain(steps=[kept, plain])
    knowing = cyclone.Worker(client, steps=[kept])
    await knowing.maintain_once()
    assert await _names(cyclone_env) == ["ret.kept"]  # the client's sweep took ret.plain
    await plain.enqueue(client, 3)
    await cyclone_env.drain(steps=[plain])
    await cyclone.Worker(client, steps=[plain]).maintain_once()  # does not know ret.kept
    assert await _names(cyclone_env) == ["ret.kept"]
    rows = await cyclone_env.pool.fetch("SELECT name, completed FROM cyclone_retention")
    assert [(r["name"], r["completed"]) for r in rows] == [("ret.kept", None)]


async def test_a_name_that_drops_its_retention_goes_back_to_the_clients(
    cyclone_env: CycloneEnv,
) -> None:
    client = cyclone.Client(cyclone_env.pool, retention=cyclone.Retention(completed=SOON))
    await kept.enqueue(client, 1)
    await cyclone_env.drain(steps=[kept])
    await cyclone.Worker(client, steps=[kept]).maintain_once()
    assert await _names(cyclone_env) == ["ret.kept"]

    # A later deploy: the same kind without a retention of its own.
    @cyclone.step("ret.kept", queue="ret")
    async def redeployed(ctx: cyclone.Context, n: int) -> int:
        return n

    await cyclone.Worker(client, steps=[redeployed]).maintain_once()
    assert await _names(cyclone_env) == []
    assert await cyclone_env.pool.fetchval("SELECT count(*) FROM cyclone_retention") == 0


async def test_keep_nothing_leaves_no_completed_run(cyclone_env: CycloneEnv) -> None:
    client = cyclone_env.client
    done = await nothing.enqueue_many(client, [1, 2, 3])
    failed = await nothing.enqueue(client, -1)
    async with cyclone_env.worker(steps=[nothing]):
        assert await failed.wait(timeout=30) is cyclone.RunState.FAILED
        for run in done:  # deleted as it completed: nothing left to wait for
            with pytest.raises(cyclone.RunNotFoundError):
                await run.wait(timeout=30)

    assert await count_rows(cyclone_env, "cyclone_runs") == 1
    assert await count_rows(cyclone_env, "cyclone_tasks") == 0
    assert (await failed.info()).state is cyclone.RunState.FAILED


async def test_a_wait_that_saw_the_run_says_why_it_is_gone(cyclone_env: CycloneEnv) -> None:
    run_id = uuid.uuid4()
    reads: list[uuid.UUID] = []

    async def read(rid: uuid.UUID) -> tuple[cyclone.RunState, None]:
        reads.append(rid)
        if len(reads) > 1:  # deleted as it completed, as keep-nothing does
            raise cyclone.RunNotFoundError(rid)
        return cyclone.RunState.RUNNING, None

    runs = cyclone_env.client.services.runs
    with pytest.raises(cyclone.RunNotFoundError, match="keeps nothing once completed"):
        await runs.until_ended(run_id, 30, read)
    with pytest.raises(cyclone.RunNotFoundError) as never_seen:  # not found from the start
        await cyclone_env.client.get_run(run_id)
    assert str(never_seen.value) == f"run {run_id} not found"


async def test_keep_nothing_inside_a_completion_transaction(cyclone_env: CycloneEnv) -> None:
    """A handler's business write commits with its run's deletion."""
    await cyclone_env.pool.execute("CREATE TABLE ret_seen (n int)")

    @cyclone.action("ret.nothing_tx", retention=cyclone.Retention(completed=cyclone.KEEP_NOTHING))
    async def write(ctx: cyclone.Context, n: int) -> None:
        tx = await ctx.completion_tx()
        await tx.execute("INSERT INTO ret_seen VALUES ($1)", n)

    run = await write.enqueue(cyclone_env.client, 5)
    await cyclone_env.drain(steps=[write])
    with pytest.raises(cyclone.RunNotFoundError):
        await run.status()
    assert await cyclone_env.pool.fetchval("SELECT array_agg(n) FROM ret_seen") == [5]


def test_retention_is_checked_when_declared() -> None:
    with pytest.raises(cyclone.InvalidInputError, match="cannot keep nothing"):
        cyclone.define_result(
            "ret.result", int, int, retention=cyclone.Retention(completed=cyclone.KEEP_NOTHING)
        )
    with pytest.raises(cyclone.InvalidInputError, match=r"must be a cyclone\.Retention"):
        cyclone.define("ret.bad", int, retention=7)  # type: ignore[arg-type]
    with pytest.raises(cyclone.InvalidInputError, match=r"Retention\.expired"):
        cyclone.Retention(expired=dt.timedelta(seconds=-1))
    assert cyclone.Retention(completed=cyclone.KEEP_NOTHING).keeps_nothing
    assert not cyclone.Retention(completed=SOON).keeps_nothing


async def test_retention_covers_expired_runs(cyclone_env: CycloneEnv) -> None:
    client = cyclone.Client(cyclone_env.pool, retention=cyclone.Retention(expired=SOON))
    past = dt.datetime.now(dt.UTC) - dt.timedelta(seconds=1)
    run = await plain.enqueue(client, 1, expires_at=past)
    worker = cyclone.Worker(client, steps=[plain])
    await worker.maintain_once()  # expires it, then purges it
    with pytest.raises(cyclone.RunNotFoundError):
        await run.status()


async def test_migration_0012_applies_on_a_schema_at_0011_with_rows(
    cyclone_env: CycloneEnv,
) -> None:
    await migrated_to(cyclone_env, "at11", 11)
    async with cyclone_env.pool.acquire() as conn:
        await conn.execute(
            "INSERT INTO at11.cyclone_runs (id, name, job, input, queue, nodes, remaining)"
            " VALUES (gen_random_uuid(), 'ret.plain', true, '1', 'ret', 1, 1)"
        )
        await conn.execute(
            "INSERT INTO at11.cyclone_tasks (run_id, kind, queue, max_attempts)"
            " SELECT id, 'ret.plain', 'ret', 1 FROM at11.cyclone_runs"
        )
    client = cyclone.Client(cyclone_env.pool, schema="at11")
    assert (await client.migrate())[0] == 12
    (old,) = (await client.list_runs()).runs
    new = await plain.enqueue(client, 2, expires_in=3600)
    async with cyclone.Worker(client, steps=[plain], poll_interval=0.05):
        assert await cyclone.Run(client, old.id).wait(timeout=30) is cyclone.RunState.COMPLETED
        assert await new.wait(timeout=30) is cyclone.RunState.COMPLETED
    with pytest.raises(asyncpg.CheckViolationError, match="cyclone_runs_state_check"):
        await cyclone_env.pool.execute("UPDATE at11.cyclone_runs SET state = 'lost'")


def test_a_worker_records_its_retentions_at_its_first_pass_then_now_and_then() -> None:
    retaining = maintenance.Retaining(Retentions(None, {}, ("ret.plain",)))
    assert retaining.declare_due()
    assert not retaining.declare_due()  # again only after DECLARE_EVERY seconds
