"""Batch steps: one handler call for many jobs, each job keeping its own outcome.

Batches start at max_size, at max_wait, or once every slot of the queue holds a waiting
item; group_by keeps groups apart; an item failing alone retries alone; a raise fails every
item; the shared completion transaction commits with every completed item or with none.
"""

from __future__ import annotations

import asyncio
import signal
import uuid
from types import SimpleNamespace
from typing import Any

import asyncpg
import pytest

import cyclone
from cyclone.testing.plugin import CycloneEnv
from tests.conftest import Probe, Records, count_rows, fast_worker, python_module, reaped
from tests.e2e.batch_app import charge_batch

probe = Probe()


@cyclone.batch_step("batch.double", queue="batch", max_size=5, max_wait=60)
async def double(ctx: cyclone.BatchContext, inputs: list[int]) -> list[int]:
    probe.calls.append(list(inputs))
    return [2 * i for i in inputs]


@cyclone.batch_step("batch.waiting", queue="batch", max_size=100, max_wait=0.3)
async def waiting(ctx: cyclone.BatchContext, inputs: list[int]) -> list[int]:
    probe.calls.append(list(inputs))
    return inputs


@cyclone.batch_step(
    "batch.grouped",
    queue="batch",
    max_size=100,
    max_wait=0.3,
    group_by=lambda word: word[0],
)
async def grouped(ctx: cyclone.BatchContext, inputs: list[str]) -> list[str]:
    probe.calls.append((ctx.group, sorted(inputs)))
    return [w.upper() for w in inputs]


@cyclone.batch_step("batch.picky", queue="batch", max_size=100, max_wait=0.3, max_attempts=3)
async def picky(ctx: cyclone.BatchContext, inputs: list[str]) -> list[str | cyclone.ItemFailed]:
    probe.calls.append([(w, a.attempt) for w, a in zip(inputs, ctx.attempts, strict=True)])
    return [
        cyclone.ItemFailed(ValueError(f"{w} is bad")) if w == "bad" and a.attempt == 1 else w
        for w, a in zip(inputs, ctx.attempts, strict=True)
    ]


@cyclone.batch_step("batch.flaky", queue="batch", max_size=3, max_wait=60, max_attempts=3)
async def flaky(ctx: cyclone.BatchContext, inputs: list[int]) -> list[int]:
    probe.calls.append([a.attempt for a in ctx.attempts])
    if len(probe.calls) == 1:
        raise RuntimeError("the whole batch failed")
    return inputs


@cyclone.batch_step("batch.short", queue="batch", max_size=3, max_wait=60, max_attempts=3)
async def short(ctx: cyclone.BatchContext, inputs: list[int]) -> list[int]:
    probe.calls.append(len(inputs))
    return inputs[:-1] if len(probe.calls) == 1 else inputs


@cyclone.batch_step("batch.sleepy", queue="batch", max_size=3, max_wait=60)
async def sleepy(ctx: cyclone.BatchContext, inputs: list[int]) -> list[int]:
    probe.calls.append([a.attempt for a in ctx.attempts])
    if len(probe.calls) == 1:
        raise cyclone.Snooze(0)
    return inputs


@cyclone.batch_action("batch.record", queue="batch", max_size=4, max_wait=0.2, max_attempts=3)
async def record(ctx: cyclone.BatchContext, inputs: list[int]) -> list[cyclone.ItemFailed | None]:
    """Writes one business row per input in the shared completion transaction; input 0
    fails on its own (once); on the first call, a duplicate fails the COMMIT (a deferred key)."""
    conn = await ctx.completion_tx()
    first = not probe.calls
    probe.calls.append([a.attempt for a in ctx.attempts])
    for i in inputs:
        if i != 0:
            await conn.execute("INSERT INTO ledger (item, attempt) VALUES ($1, 1)", i)
    if first and probe.stopped.is_set():  # the failed-commit test: a duplicate key
        await conn.execute("INSERT INTO ledger (item, attempt) VALUES ($1, 1)", inputs[-1])
    return [
        cyclone.ItemFailed(ValueError("zero")) if i == 0 and a.attempt == 1 else None
        for i, a in zip(inputs, ctx.attempts, strict=True)
    ]


@cyclone.batch_step("batch.hold", queue="batch", max_size=3, max_wait=0.5, max_attempts=3)
async def hold(ctx: cyclone.BatchContext, inputs: list[int]) -> list[int]:
    """Writes its ledger rows, then (on the first call) waits for the test."""
    conn = await ctx.completion_tx()
    for i in inputs:
        await conn.execute(
            "INSERT INTO ledger (item, attempt) VALUES ($1, $2)", i, len(probe.calls)
        )
    probe.calls.append([a.attempt for a in ctx.attempts])
    if len(probe.calls) == 1:
        probe.started.set()
        await probe.stopped.wait()
    return inputs


async def results(runs: list[cyclone.ResultRun[Any]]) -> list[Any]:
    return [await r.result(timeout=60) for r in runs]


async def test_a_batch_starts_at_max_size(cyclone_env: CycloneEnv) -> None:
    probe.reset()
    runs = await double.enqueue_many(cyclone_env.client, list(range(10)))
    # 20 slots, max_wait 60 s: only max_size starts these batches in time.
    async with fast_worker(cyclone_env.client, steps=[double], queues={"batch": 20}):
        assert await results(runs) == [2 * i for i in range(10)]
    assert sorted(len(c) for c in probe.calls) == [5, 5]


async def test_a_batch_starts_once_every_slot_holds_a_waiting_item(
    cyclone_env: CycloneEnv,
) -> None:
    probe.reset()
    runs = await double.enqueue_many(cyclone_env.client, list(range(6)))
    # 3 slots, below max_size 5, and max_wait 60 s: no more items can come, so it starts.
    async with fast_worker(cyclone_env.client, steps=[double], queues={"batch": 3}):
        assert await results(runs) == [2 * i for i in range(6)]
    assert [len(c) for c in probe.calls] == [3, 3]


async def test_a_batch_starts_at_max_wait(cyclone_env: CycloneEnv) -> None:
    probe.reset()
    runs = await waiting.enqueue_many(cyclone_env.client, [1, 2, 3])
    async with fast_worker(cyclone_env.client, steps=[waiting], queues={"batch": 20}):
        started = asyncio.get_running_loop().time()
        assert await results(runs) == [1, 2, 3]
        assert asyncio.get_running_loop().time() - started >= 0.3
    assert probe.calls == [[1, 2, 3]]


async def test_a_concurrency_limit_bounds_every_batch(cyclone_env: CycloneEnv) -> None:
    """Flow control holds job by job: with at most 2 of the kind running, no batch holds
    more than 2 jobs, and every job still completes once."""
    probe.reset()
    client = cyclone_env.client
    await client.queues.set_kind_limits("batch.waiting", concurrency=2)
    runs = await waiting.enqueue_many(client, list(range(6)))
    async with fast_worker(client, steps=[waiting], queues={"batch": 20}):
        assert await results(runs) == list(range(6))
    assert max(len(call) for call in probe.calls) <= 2
    assert sorted(i for call in probe.calls for i in call) == list(range(6))


async def test_group_by_keeps_groups_apart(cyclone_env: CycloneEnv) -> None:
    probe.reset()
    words = ["apple", "banana", "avocado", "blueberry", "apricot"]
    runs = await grouped.enqueue_many(cyclone_env.client, words)
    async with fast_worker(cyclone_env.client, steps=[grouped], queues={"batch": 20}):
        assert await results(runs) == [w.upper() for w in words]
    assert sorted(probe.calls) == [
        ("a", ["apple", "apricot", "avocado"]),
        ("b", ["banana", "blueberry"]),
    ]


async def test_an_item_that_fails_alone_retries_alone(cyclone_env: CycloneEnv) -> None:
    probe.reset()
    runs = await picky.enqueue_many(cyclone_env.client, ["good", "bad", "fine"])
    async with fast_worker(cyclone_env.client, steps=[picky], queues={"batch": 20}):
        assert await results(runs) == ["good", "bad", "fine"]
    # The others ran once; "bad" ran again, alone, as its second attempt.
    assert probe.calls == [[("good", 1), ("bad", 1), ("fine", 1)], [("bad", 2)]]
    infos = [await r.info() for r in runs]
    assert [len(i.nodes[0].errors) for i in infos] == [0, 1, 0]
    assert infos[1].nodes[0].errors[0]["message"] == "bad is bad"


async def test_a_raising_handler_fails_every_item(cyclone_env: CycloneEnv) -> None:
    probe.reset()
    runs = await flaky.enqueue_many(cyclone_env.client, [1, 2, 3])
    async with fast_worker(cyclone_env.client, steps=[flaky], queues={"batch": 20}):
        assert await results(runs) == [1, 2, 3]
    assert probe.calls == [[1, 1, 1], [2, 2, 2]]  # each item spent an attempt
    for run in runs:
        [error] = (await run.info()).nodes[0].errors
        assert error["type"] == "RuntimeError"


async def test_a_result_missing_fails_every_item(cyclone_env: CycloneEnv) -> None:
    probe.reset()
    runs = await short.enqueue_many(cyclone_env.client, [1, 2, 3])
    async with fast_worker(cyclone_env.client, steps=[short], queues={"batch": 20}):
        assert await results(runs) == [1, 2, 3]
    for run in runs:
        [error] = (await run.info()).nodes[0].errors
        assert error["type"] == "InvalidStateError"
        assert "returned 2 results for 3 inputs" in error["message"]


async def test_snooze_snoozes_every_item(cyclone_env: CycloneEnv) -> None:
    probe.reset()
    runs = await sleepy.enqueue_many(cyclone_env.client, [1, 2, 3])
    async with fast_worker(cyclone_env.client, steps=[sleepy], queues={"batch": 20}):
        assert await results(runs) == [1, 2, 3]
    assert probe.calls == [[1, 1, 1], [1, 1, 1]]  # refunded: the same attempts again


@pytest.fixture
async def ledger(cyclone_env: CycloneEnv) -> CycloneEnv:
    probe.reset()
    await cyclone_env.pool.execute(
        "CREATE TABLE ledger (item int, attempt int, UNIQUE (item) DEFERRABLE INITIALLY DEFERRED)"
    )
    return cyclone_env


async def ledger_items(env: CycloneEnv) -> list[int]:
    return [r["item"] for r in await env.pool.fetch("SELECT item FROM ledger ORDER BY item")]


async def test_the_completion_transaction_commits_with_the_completed_items(
    ledger: CycloneEnv,
) -> None:
    runs = await record.enqueue_many(ledger.client, [1, 2, 3, 0])
    async with fast_worker(ledger.client, steps=[record], queues={"batch": 20}):
        for run in runs:
            assert await run.wait(timeout=60) is cyclone.RunState.COMPLETED
    assert await ledger_items(ledger) == [1, 2, 3]  # committed once, with their items
    # Item 0 failed alone (outside the transaction) and ran again alone.
    assert probe.calls == [[1, 1, 1, 1], [2]]
    assert [len((await r.info()).nodes[0].errors) for r in runs] == [0, 0, 0, 1]


async def test_a_failed_commit_completes_none_of_the_items(ledger: CycloneEnv) -> None:
    probe.stopped.set()  # the first call writes a duplicate key: its COMMIT fails
    runs = await record.enqueue_many(ledger.client, [1, 2, 3])
    async with fast_worker(ledger.client, steps=[record], queues={"batch": 3}):
        for run in runs:
            assert await run.wait(timeout=60) is cyclone.RunState.COMPLETED
    assert probe.calls == [[1, 1, 1], [2, 2, 2]]  # none completed: all ran again
    assert await ledger_items(ledger) == [1, 2, 3]  # the first call's rows rolled back
    for run in runs:
        [error] = (await run.info()).nodes[0].errors
        assert error["type"] == "CompletionAborted"


async def test_a_cancelled_item_rolls_back_its_batchs_completion(
    ledger: CycloneEnv, records: Records
) -> None:
    runs = await hold.enqueue_many(ledger.client, [1, 2, 3])
    # A quick heartbeat, not a short lease: a lease lapsing on a slow heartbeat would hand
    # items 2 and 3 to a second call, whose COMMIT waits on the first one's ledger rows.
    async with fast_worker(ledger.client, steps=[hold], queues={"batch": 20}, heartbeat=0.2):
        await asyncio.wait_for(probe.started.wait(), 30)
        await runs[0].cancel()
        await records.wait_for("stopped: its run is cancelled")  # the heartbeat saw it
        probe.stopped.set()  # the handler returns all three
        for run in runs[1:]:
            assert await run.result(timeout=60) == run_input(runs, run)
    assert await runs[0].status() is cyclone.RunState.CANCELLED
    # The first call's rows (item 1's among them) rolled back; items 2 and 3 ran again.
    assert probe.calls == [[1, 1, 1], [2, 2]]
    rows = await ledger.pool.fetch("SELECT item, attempt FROM ledger ORDER BY item")
    assert [tuple(r) for r in rows] == [(2, 1), (3, 1)]
    for run in runs[1:]:
        [error] = (await run.info()).nodes[0].errors
        assert error["type"] == "CompletionAborted"


def run_input(runs: list[cyclone.ResultRun[int]], run: cyclone.ResultRun[int]) -> int:
    return runs.index(run) + 1


async def test_a_stopping_worker_hands_back_the_items_waiting_for_a_batch(
    cyclone_env: CycloneEnv, records: Records
) -> None:
    probe.reset()
    runs = await double.enqueue_many(cyclone_env.client, [1, 2])  # max_size 5, max_wait 60 s
    async with fast_worker(cyclone_env.client, steps=[double], queues={"batch": 20}):
        async with asyncio.timeout(30):
            # The claim's rows, in the database: no event to await.
            while await count_rows(cyclone_env, "cyclone_tasks", "state = 'running'") < 2:  # noqa: ASYNC110
                await asyncio.sleep(0.01)
    assert probe.calls == []  # never called
    # At once, as the worker stops: not cancelled after the shutdown timeout.
    assert len(records.messages("not started yet; handed back to its queue")) == 2
    assert not records.messages("interrupted by shutdown")
    assert await count_rows(cyclone_env, "cyclone_tasks", "state = 'available'") == 2
    for run in runs:
        info = await run.info()
        assert info.nodes[0].errors == [] and info.state is cyclone.RunState.PENDING


def test_a_batch_step_is_not_a_workflow_node() -> None:
    wf = cyclone.define("batch.flow", int)
    with pytest.raises(cyclone.InvalidInputError, match="cannot be a workflow node"):
        wf.node(double)
    with pytest.raises(cyclone.InvalidInputError, match="cannot be a workflow node"):
        cyclone.define("batch.map", list[int]).map(double)


def test_declarations_are_checked() -> None:
    async def single(ctx: cyclone.BatchContext, inputs: int) -> list[int]:
        return [inputs]

    with pytest.raises(cyclone.InvalidInputError, match=r"list\[InputType\]"):
        cyclone.batch_step("batch.single")(single)

    async def nothing(ctx: cyclone.BatchContext, inputs: list[int]) -> None:
        return None

    with pytest.raises(cyclone.InvalidInputError, match="batch_action"):
        cyclone.batch_step("batch.nothing")(nothing)
    with pytest.raises(cyclone.InvalidInputError, match="max_size"):
        cyclone.batch_step("batch.huge", max_size=0)(double.batch_handler)
    with pytest.raises(cyclone.InvalidInputError, match="unknown options max_items"):
        cyclone.batch_step("batch.typo", max_items=5)(double.batch_handler)
    assert double.output_type is int and double.input_type is int
    assert record.output_type is type(None)


async def test_calling_a_batch_step_runs_a_batch_of_one() -> None:
    probe.reset()
    attempt = SimpleNamespace(run_id=uuid.uuid4(), node=None, attempt=1, max_attempts=3)
    ctx = cyclone.BatchContext(None, "batch.picky", "batch", None, [attempt])
    assert await double(ctx, 4) == 8
    with pytest.raises(ValueError, match="bad is bad"):
        await picky(ctx, "bad")


async def start_worker(dsn: str, lease: float) -> asyncio.subprocess.Process:
    return await python_module("tests.e2e.batch_app", dsn, lease)


async def test_a_batch_whose_worker_is_killed_completes_every_item_once(
    cyclone_env: CycloneEnv,
) -> None:
    await cyclone_env.pool.execute(
        "CREATE TABLE charges (order_id int, attempt int); CREATE TABLE started (attempts text)"
    )
    runs = await charge_batch.enqueue_many(cyclone_env.client, [1, 2, 3, 4, 5])
    started: asyncio.Queue[str] = asyncio.Queue()
    listener = await asyncpg.connect(cyclone_env.dsn)
    try:
        await listener.add_listener("e2e_batch", lambda *a: started.put_nowait(str(a[-1])))
        async with reaped(await start_worker(cyclone_env.dsn, lease=1.0)) as doomed:
            assert await asyncio.wait_for(started.get(), 60) == "1,1,1,1,1"
            doomed.send_signal(signal.SIGKILL)  # inside the handler, before it commits
            assert await doomed.wait() == -signal.SIGKILL
        async with reaped(await start_worker(cyclone_env.dsn, lease=30.0)):
            for run in runs:
                assert await run.wait(timeout=60) is cyclone.RunState.COMPLETED
    finally:
        await listener.close()
    assert await results(runs) == [f"charged {i}" for i in range(1, 6)]
    charges = await cyclone_env.pool.fetch("SELECT order_id, attempt FROM charges ORDER BY 1")
    # Every item charged exactly once, by the second worker; the first one's writes died.
    assert [tuple(r) for r in charges] == [(i, 2) for i in range(1, 6)]
