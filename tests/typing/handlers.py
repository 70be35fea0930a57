"""Handlers: dependency outputs, the completion transaction, completion enqueues, the test kit."""

from __future__ import annotations

import uuid
from typing import Any, assert_type

import asyncpg
import msgspec

import cyclone
import cyclone.testing


class Order(msgspec.Struct):
    order_id: int
    cents: int


@cyclone.step("order.charge")
async def charge(ctx: cyclone.Context, order: Order) -> int:
    return order.cents


@cyclone.step("order.receipt")
async def receipt(ctx: cyclone.Context, order: Order) -> str:
    return "ok"


# A handler's first parameter is its context: anything else is refused.
@cyclone.step("order.wrong_context")  # type: ignore[type-var]
async def wrong_context(ctx: int, order: Order) -> int:
    return order.cents


# A plain def handler runs in a worker's thread; its step is typed as an async one's.
@cyclone.step("order.weigh")
def weigh(ctx: cyclone.Context, order: Order) -> float:
    ctx.raise_if_cancelled()
    return 0.5 if not ctx.cancelled else 0.0


@cyclone.action("order.archive")
def archive(ctx: cyclone.Context, order: Order) -> None:
    return None


assert_type(weigh, cyclone.Step[Order, float])
assert_type(archive, cyclone.Step[Order, None])


# The same rules as an async handler's: its context first, and an action returns None.
@cyclone.step("order.sync_wrong_context")  # type: ignore[arg-type, type-var]
def sync_wrong_context(ctx: int, order: Order) -> int:
    return order.cents


@cyclone.action("order.sync_returns")  # type: ignore[arg-type]
def sync_returns(ctx: cyclone.Context, order: Order) -> int:
    return order.cents


checkout = cyclone.define_result("checkout", Order, int)
charged = checkout.node(charge)
checkout.node(receipt, after=[charged])
checkout.set_result(charged)
plain = cyclone.define("plain", Order)


async def in_a_handler(ctx: cyclone.Context, client: cyclone.Client, order: Order) -> None:
    assert_type(await ctx.output(charged), int)
    assert_type(await ctx.output("order.charge"), Any)
    conn = await ctx.completion_tx()
    assert_type(conn, asyncpg.pool.PoolConnectionProxy)
    assert_type(await conn.execute("SELECT 1"), str)
    assert_type(
        await cyclone.enqueue_completion(ctx, client, charge, order, priority=1),
        cyclone.ResultRun[int],
    )
    assert_type(
        await cyclone.submit_completion(ctx, client, checkout, order), cyclone.ResultRun[int]
    )
    assert_type(await cyclone.submit_completion(ctx, client, plain, order), cyclone.Run)
    assert_type(ctx.run_id, uuid.UUID)
    assert_type(ctx.node, str | None)
    assert_type(ctx.attempt, int)


async def wrong_in_a_handler(ctx: cyclone.Context, client: cyclone.Client, order: Order) -> None:
    text: str = await ctx.output(charged)  # type: ignore[arg-type]
    await ctx.output(3)  # type: ignore[call-overload]
    await cyclone.enqueue_completion(ctx, client, charge, order, priority="high")  # type: ignore[arg-type]
    await cyclone.submit_completion(ctx, client, checkout, order, queue="q")  # type: ignore[call-overload]
    await cyclone.enqueue_completion(ctx, client, charge, "order")  # type: ignore[misc]
    del text


async def unit_test() -> None:
    recorder = cyclone.testing.TxRecorder()
    ctx = cyclone.testing.new_context(completion_tx=recorder, outputs={"order.charge": 5})
    assert_type(ctx, cyclone.Context)
    assert_type(await charge(ctx, Order(1, 5)), int)
    assert_type(await weigh(ctx, Order(1, 5)), float)
    assert_type(checkout.node(weigh, name="weighed"), cyclone.Node[float])
    assert_type(recorder.enqueued, list[cyclone.testing.RecordedEnqueue])
    assert_type(recorder.submitted, list[cyclone.testing.RecordedSubmit])
    assert_type(recorder.queries, list[cyclone.testing.RecordedQuery])
    assert_type(recorder.enqueued[0].run_id, uuid.UUID)
    cyclone.testing.new_context(completion_tx=object())  # type: ignore[arg-type]
    cyclone.testing.new_context(attempt="1")  # type: ignore[arg-type]


async def runs(client: cyclone.Client, run_id: uuid.UUID) -> None:
    assert_type(cyclone.ResultRun(client, run_id, int), cyclone.ResultRun[int])
    assert_type(cyclone.ResultRun(client, run_id, list[Order]), cyclone.ResultRun[list[Order]])
    assert_type(cyclone.ResultRun(client, run_id, int | None), cyclone.ResultRun[Any])
    assert_type(await client.get_run(run_id), cyclone.Run)
    assert_type(await client.get_run(run_id, Order), cyclone.ResultRun[Order])
    assert_type(await (await client.get_run(run_id, int)).result(), int)
    assert_type(await (await client.get_run(run_id)).wait(), cyclone.RunState)
    # A handle of a narrower output stands where a wider one is wanted (a bool is an int).
    wide: cyclone.ResultRun[int] = cyclone.ResultRun(client, run_id, bool)
    del wide
    (await client.get_run(run_id)).result()  # type: ignore[attr-defined]


async def worker_of(client: cyclone.Client) -> None:
    # A worker's client is typed as the client it was given, whole.
    worker = cyclone.Worker(client, steps=[charge])
    assert_type(worker.client, cyclone.Client)
    assert_type(await worker.client.stats(), list[cyclone.QueueStats])


def any_worker(worker: cyclone.Worker) -> None:
    worker.hurry()  # a bare annotation needs no type argument
