"""Standalone jobs: the enqueue family, transactional enqueueing, unique keys, bad input."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import uuid
from typing import Any

import asyncpg
import msgspec
import pytest

import cyclone
from cyclone.testing.plugin import CycloneEnv
from tests.conftest import count_rows, recording_queries


class WelcomeEmail(msgspec.Struct):
    user_id: int


@dataclasses.dataclass
class Receipt:
    order_id: int


@cyclone.action("email.welcome", queue="mail")
async def send_welcome(ctx: cyclone.Context, msg: WelcomeEmail) -> None:
    return None


@cyclone.step("receipt.send", queue="mail", max_attempts=3)
async def send_receipt(ctx: cyclone.Context, r: Receipt) -> str:
    return f"sent {r.order_id}"


@cyclone.step("count.up")
async def count_up(ctx: cyclone.Context, n: int) -> int:
    return n + 1


async def make_orders_table(env: CycloneEnv) -> None:
    await env.pool.execute("CREATE TABLE orders (id bigserial PRIMARY KEY, user_id int NOT NULL)")


async def test_enqueue_makes_a_pending_run(cyclone_env: CycloneEnv) -> None:
    run = await send_welcome.enqueue(cyclone_env.client, WelcomeEmail(user_id=7))
    assert await run.status() is cyclone.RunState.PENDING
    info = await run.info()
    assert info.name == "email.welcome"
    assert info.job
    assert [(n.name, n.state, n.attempts) for n in info.nodes] == [
        ("email.welcome", "available", 0)
    ]
    stored = await cyclone_env.pool.fetchval(
        "SELECT input::text FROM cyclone_runs WHERE id = $1", run.id
    )
    assert msgspec.json.decode(stored) == {"user_id": 7}


async def test_package_functions_match_methods(cyclone_env: CycloneEnv) -> None:
    client = cyclone_env.client
    one = await cyclone.enqueue(client, count_up, 1)
    many = await cyclone.enqueue_many(client, count_up, [1, 2])
    async with cyclone_env.pool.acquire() as conn, conn.transaction():
        tx_one = await cyclone.enqueue_tx(client, conn, count_up, 3)
        tx_many = await cyclone.enqueue_many_tx(client, conn, count_up, [4, 5])
    runs = [one, *many, tx_one, *tx_many]
    assert len({r.id for r in runs}) == 6
    for run in runs:
        assert await run.status() is cyclone.RunState.PENDING


async def test_enqueue_many_keeps_input_order(cyclone_env: CycloneEnv) -> None:
    inputs = list(range(100, 0, -1))
    runs = await count_up.enqueue_many(cyclone_env.client, inputs)
    assert len(runs) == len(inputs)
    rows = await cyclone_env.pool.fetch(
        "SELECT r.id, r.input::text AS input FROM cyclone_tasks t"
        " JOIN cyclone_runs r ON r.id = t.run_id ORDER BY t.id"
    )
    assert [r["id"] for r in rows] == [run.id for run in runs]
    assert [int(r["input"]) for r in rows] == inputs


async def test_enqueue_many_of_nothing_writes_nothing(cyclone_env: CycloneEnv) -> None:
    assert await count_up.enqueue_many(cyclone_env.client, []) == []
    assert await count_rows(cyclone_env, "cyclone_runs") == 0


async def test_rollback_leaves_no_job(cyclone_env: CycloneEnv) -> None:
    # The rollback path of transactional enqueueing: the handle exists, the run never does.
    conn = await cyclone_env.pool.acquire()
    try:
        tx = conn.transaction()
        await tx.start()
        run = await send_welcome.enqueue_tx(cyclone_env.client, conn, WelcomeEmail(user_id=42))
        await tx.rollback()
    finally:
        await cyclone_env.pool.release(conn)
    with pytest.raises(cyclone.RunNotFoundError) as raised:
        await run.status()
    assert raised.value.run_id == run.id
    page = await cyclone_env.client.list_runs(cyclone.RunQuery())
    assert page.runs == []


async def test_handle_is_not_found_until_commit(cyclone_env: CycloneEnv) -> None:
    async with cyclone_env.pool.acquire() as conn, conn.transaction():
        run = await send_welcome.enqueue_tx(cyclone_env.client, conn, WelcomeEmail(user_id=1))
        with pytest.raises(cyclone.RunNotFoundError):
            await run.status()  # the handle reads through the pool: not visible yet
    assert await run.status() is cyclone.RunState.PENDING


async def test_business_row_and_job_commit_together(cyclone_env: CycloneEnv) -> None:
    await make_orders_table(cyclone_env)
    async with cyclone_env.pool.acquire() as conn, conn.transaction():
        order_id = await conn.fetchval("INSERT INTO orders (user_id) VALUES (5) RETURNING id")
        run = await send_receipt.enqueue_tx(cyclone_env.client, conn, Receipt(order_id))
    assert await cyclone_env.pool.fetchval("SELECT count(*) FROM orders") == 1
    assert await run.status() is cyclone.RunState.PENDING


async def test_business_failure_takes_the_job_with_it(cyclone_env: CycloneEnv) -> None:
    await make_orders_table(cyclone_env)
    runs = []
    with pytest.raises(asyncpg.NotNullViolationError):
        async with cyclone_env.pool.acquire() as conn, conn.transaction():
            runs.append(await send_receipt.enqueue_tx(cyclone_env.client, conn, Receipt(1)))
            await conn.execute("INSERT INTO orders (user_id) VALUES (NULL)")
    assert await cyclone_env.pool.fetchval("SELECT count(*) FROM orders") == 0
    assert await count_rows(cyclone_env, "cyclone_runs") == 0
    assert await count_rows(cyclone_env, "cyclone_tasks") == 0
    with pytest.raises(cyclone.RunNotFoundError):
        await runs[0].status()


async def test_tx_call_needs_an_open_transaction(cyclone_env: CycloneEnv) -> None:
    async with cyclone_env.pool.acquire() as conn:
        with pytest.raises(cyclone.NotInTransactionError):
            await send_welcome.enqueue_tx(cyclone_env.client, conn, WelcomeEmail(user_id=1))
        with pytest.raises(cyclone.NotInTransactionError):
            await count_up.enqueue_many_tx(cyclone_env.client, conn, [1])
    assert await count_rows(cyclone_env, "cyclone_runs") == 0


async def test_unique_key_is_held_by_an_active_run(cyclone_env: CycloneEnv) -> None:
    client = cyclone_env.client
    first = await count_up.enqueue(client, 1, unique="nightly")
    with pytest.raises(cyclone.DuplicateError) as raised:
        await count_up.enqueue(client, 2, unique="nightly")
    assert raised.value.run_id == first.id
    assert raised.value.key == "nightly"
    # Unique per kind: another kind may use the same key.
    await send_receipt.enqueue(client, Receipt(1), unique="nightly")
    # Once the holder ends, the key is free.
    assert await first.cancel()
    again = await count_up.enqueue(client, 3, unique="nightly")
    assert again.id != first.id
    assert await count_rows(cyclone_env, "cyclone_runs") == 3


async def test_duplicate_in_a_transaction_leaves_it_usable(cyclone_env: CycloneEnv) -> None:
    await make_orders_table(cyclone_env)
    client = cyclone_env.client
    holder = await count_up.enqueue(client, 1, unique="k")
    async with cyclone_env.pool.acquire() as conn, conn.transaction():
        await conn.execute("INSERT INTO orders (user_id) VALUES (1)")
        with pytest.raises(cyclone.DuplicateError) as raised:
            await count_up.enqueue_tx(client, conn, 2, unique="k")
        assert raised.value.run_id == holder.id
        # The transaction is not aborted: more writes and a commit still work.
        await conn.execute("INSERT INTO orders (user_id) VALUES (2)")
        other = await count_up.enqueue_tx(client, conn, 3)
    assert await cyclone_env.pool.fetchval("SELECT count(*) FROM orders") == 2
    assert await other.status() is cyclone.RunState.PENDING
    assert await count_rows(cyclone_env, "cyclone_runs") == 2


async def test_same_unique_key_twice_in_one_transaction(cyclone_env: CycloneEnv) -> None:
    async with cyclone_env.pool.acquire() as conn, conn.transaction():
        first = await count_up.enqueue_tx(cyclone_env.client, conn, 1, unique="k")
        with pytest.raises(cyclone.DuplicateError) as raised:
            await count_up.enqueue_tx(cyclone_env.client, conn, 1, unique="k")
        assert raised.value.run_id == first.id


async def test_unique_with_many_is_refused(cyclone_env: CycloneEnv) -> None:
    with pytest.raises(cyclone.InvalidInputError, match="single enqueue"):
        await count_up.enqueue_many(cyclone_env.client, [1, 2], unique="k")
    assert await count_rows(cyclone_env, "cyclone_runs") == 0


async def test_scheduled_job_waits_for_its_time(cyclone_env: CycloneEnv) -> None:
    later = dt.datetime.now(dt.UTC) + dt.timedelta(hours=1)
    run = await count_up.enqueue(cyclone_env.client, 1, process_at=later)
    soon = await count_up.enqueue(cyclone_env.client, 1, process_in=dt.timedelta(minutes=5))
    for r in (run, soon):
        info = await r.info()
        assert info.nodes[0].state == "scheduled"
    stored = await cyclone_env.pool.fetchval(
        "SELECT available_at FROM cyclone_tasks WHERE run_id = $1", run.id
    )
    assert stored == later


async def test_options_are_stored(cyclone_env: CycloneEnv) -> None:
    deadline = dt.datetime.now(dt.UTC) + dt.timedelta(days=1)
    run = await count_up.enqueue(
        cyclone_env.client,
        1,
        queue="other",
        priority=5,
        max_attempts=2,
        sequence="s1",
        run_deadline=deadline,
    )
    row = await cyclone_env.pool.fetchrow(
        "SELECT t.queue, t.priority, t.max_attempts, t.sequence_key, r.deadline"
        " FROM cyclone_tasks t JOIN cyclone_runs r ON r.id = t.run_id WHERE r.id = $1",
        run.id,
    )
    assert tuple(row) == ("other", 5, 2, "s1", deadline)


def refused(error: type[Exception], case: str, **options: object) -> Any:
    """An enqueue with ``options`` (the input a valid WelcomeEmail unless given) that must
    raise ``error``."""
    return pytest.param({"input": WelcomeEmail(user_id=1), **options}, error, id=case)


BAD_CALLS = [
    refused(cyclone.InvalidInputError, "wrong-type", input="not a struct"),
    refused(cyclone.InvalidKeyError, "empty-key", unique=""),
    refused(cyclone.InvalidKeyError, "nul-key", unique="a\x00b"),
    refused(cyclone.InvalidKeyError, "surrogate-key", unique="\ud800"),
    refused(cyclone.InvalidKeyError, "key-257-bytes", unique="é" * 129),
    refused(cyclone.InvalidKeyError, "empty-sequence", sequence=""),
    refused(cyclone.InvalidInputError, "naive-datetime", process_at=dt.datetime(2030, 1, 1)),
    refused(cyclone.InvalidInputError, "naive-deadline", run_deadline=dt.datetime(2030, 1, 1)),
    refused(cyclone.InvalidInputError, "negative-delay", process_in=-1),
    refused(cyclone.InvalidInputError, "both", process_in=1, process_at=dt.datetime.now(dt.UTC)),
    refused(cyclone.InvalidInputError, "priority-type", priority="high"),
    refused(cyclone.InvalidInputError, "zero-attempts", max_attempts=0),
    refused(cyclone.InvalidInputError, "bad-queue", queue="no spaces"),
    refused(cyclone.InvalidInputError, "unknown-option", colour="red"),
]


@pytest.mark.parametrize(("call", "error"), BAD_CALLS)
async def test_bad_input_is_refused_before_any_sql(
    cyclone_env: CycloneEnv, call: dict[str, object], error: type[Exception]
) -> None:
    kwargs = dict(call)
    payload = kwargs.pop("input")
    async with (
        cyclone_env.pool.acquire() as conn,
        recording_queries(conn) as sent,
        conn.transaction(),
    ):
        with pytest.raises(error):
            await send_welcome.enqueue_tx(cyclone_env.client, conn, payload, **kwargs)
    assert sent == []
    assert await count_rows(cyclone_env, "cyclone_runs") == 0


async def test_payloads_that_cannot_be_stored(cyclone_env: CycloneEnv) -> None:
    client = cyclone.Client(cyclone_env.pool, payload_limit=64)
    text = cyclone.register_kind("text", str, None)
    with pytest.raises(cyclone.PayloadTooLargeError) as raised:
        await text.enqueue(client, "x" * 100)
    assert (raised.value.size, raised.value.limit) == (102, 64)
    with pytest.raises(cyclone.InvalidInputError, match="NUL"):
        await text.enqueue(client, "a\x00b")
    # An escaped backslash before u0000 is not a NUL and is stored as is.
    run = await text.enqueue(client, "\\u0000")
    stored = await cyclone_env.pool.fetchval(
        "SELECT input #>> '{}' FROM cyclone_runs WHERE id = $1", run.id
    )
    assert stored == "\\u0000"
    anything = cyclone.register_kind("anything", object, None)
    with pytest.raises(cyclone.InvalidInputError, match="encoded"):
        await anything.enqueue(client, {1, 2} | {object()})
    assert await count_rows(cyclone_env, "cyclone_runs") == 1


async def test_a_batch_is_checked_value_by_value(cyclone_env: CycloneEnv) -> None:
    # The batch travels as one JSON array: the limit holds for each value, not for the array.
    client = cyclone.Client(cyclone_env.pool, payload_limit=64)
    text = cyclone.register_kind("text", str, None)
    runs = await text.enqueue_many(client, ["x" * 60, "y" * 60, "\\u0000"])
    stored = await cyclone_env.pool.fetch(
        "SELECT input #>> '{}' AS v FROM cyclone_runs ORDER BY id"
    )
    assert [r["v"] for r in stored] == ["x" * 60, "y" * 60, "\\u0000"]
    assert [await r.status() for r in runs] == [cyclone.RunState.PENDING] * 3
    with pytest.raises(cyclone.PayloadTooLargeError) as raised:
        await text.enqueue_many(client, ["a", "x" * 100, "b"])
    assert (raised.value.size, raised.value.limit) == (102, 64)
    with pytest.raises(cyclone.InvalidInputError, match="NUL"):
        await text.enqueue_many(client, ["a", "b\x00"])
    assert await count_rows(cyclone_env, "cyclone_runs") == 3


async def test_closed_pool_gives_a_clear_error(cyclone_env: CycloneEnv) -> None:
    pool = await asyncpg.create_pool(cyclone_env.dsn, min_size=0, max_size=1)
    client = cyclone.Client(pool)
    await pool.close()
    with pytest.raises(cyclone.InvalidStateError, match="closed"):
        await count_up.enqueue(client, 1)


async def test_unknown_run_is_not_found(cyclone_env: CycloneEnv) -> None:
    with pytest.raises(cyclone.RunNotFoundError):
        await cyclone_env.client.get_run(uuid.uuid4())


async def test_get_run_with_an_output_type_gives_a_result_handle(cyclone_env: CycloneEnv) -> None:
    run = await count_up.enqueue(cyclone_env.client, 41)
    await cyclone_env.drain(steps=[count_up])
    assert type(await cyclone_env.client.get_run(run.id)) is cyclone.Run
    typed = await cyclone_env.client.get_run(run.id, int)
    assert isinstance(typed, cyclone.ResultRun)
    assert await typed.result(timeout=60) == 42
    with pytest.raises(cyclone.RunNotFoundError):
        await cyclone_env.client.get_run(uuid.uuid4(), int)


@cyclone.step("unique.fails", max_attempts=1)
async def always_fails(ctx: cyclone.Context, n: int) -> int:
    raise RuntimeError("no")


async def test_retry_of_a_job_whose_unique_key_was_taken(cyclone_env: CycloneEnv) -> None:
    client = cyclone_env.client
    failed = await always_fails.enqueue(client, 1, unique="nightly")
    async with cyclone_env.worker(steps=[always_fails]):
        assert await failed.wait(timeout=30) is cyclone.RunState.FAILED
    holder = await always_fails.enqueue(client, 2, unique="nightly")  # the key is free again
    with pytest.raises(cyclone.DuplicateError) as raised:
        await failed.retry_all()
    assert raised.value.run_id == holder.id
    assert await failed.status() is cyclone.RunState.FAILED


failing = {"on": True}


@cyclone.step("retry.flaky", max_attempts=1)
async def flaky(ctx: cyclone.Context, n: int) -> int:
    if failing["on"]:
        raise RuntimeError("not yet")
    return n


async def test_retry_of_a_job_names_its_one_node(cyclone_env: CycloneEnv) -> None:
    """A job's one node carries its kind's name: retry(node) takes that name, and no other."""
    failing["on"] = True
    run = await flaky.enqueue(cyclone_env.client, 7)
    async with cyclone_env.worker(steps=[flaky]):
        assert await run.wait(timeout=30) is cyclone.RunState.FAILED
        assert [n.name for n in (await run.info()).nodes] == ["retry.flaky"]
        with pytest.raises(cyclone.UnknownKindError, match="no node 'other'"):
            await run.retry("other")
        assert await run.status() is cyclone.RunState.FAILED  # left as it was
        failing["on"] = False
        await run.retry("retry.flaky")
        assert await run.result(timeout=30) == 7


async def test_connections_go_back_to_the_pool(cyclone_env: CycloneEnv) -> None:
    """A plain enqueue gives its connection back in the background, cancelled or not: on a
    pool of one connection, every later call still gets it."""
    pool = await asyncpg.create_pool(cyclone_env.dsn, min_size=1, max_size=1)
    client = cyclone.Client(pool)
    try:
        cancelled = asyncio.get_running_loop().create_task(count_up.enqueue(client, 0))
        await asyncio.sleep(0)  # it holds the connection now
        cancelled.cancel()
        async with asyncio.timeout(60):
            handles = [await count_up.enqueue(client, i) for i in range(20)]
            await client.aclose()
        assert pool.get_idle_size() == pool.get_size() == 1
        assert len({h.id for h in handles}) == 20
    finally:
        await pool.close()


async def test_enqueues_in_a_row_share_one_connection(cyclone_env: CycloneEnv) -> None:
    """Plain enqueues one after another keep their connection until the event loop's next
    turn: no acquire, and so no reset round trip on release, between them."""
    acquired = 0

    async def setup(_conn: object) -> None:  # asyncpg calls it on every acquire
        nonlocal acquired
        acquired += 1

    pool = await asyncpg.create_pool(cyclone_env.dsn, min_size=1, max_size=4, setup=setup)
    client = cyclone.Client(pool)
    try:
        for i in range(20):
            await count_up.enqueue(client, i)
        assert acquired == 1
        await asyncio.sleep(0)  # the loop turns: the connection goes back
        await client.aclose()
        assert pool.get_idle_size() == pool.get_size()
    finally:
        await pool.close()
