"""Handlers run as plain coroutines with cyclone.testing: no worker, no database."""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator, Iterator

import anyio.from_thread
import msgspec
import pytest

import cyclone
from cyclone.testing import TxRecorder, new_context


class Invoice(msgspec.Struct):
    order_id: int
    cents: int


notify_customer = cyclone.register_kind("customer.notify", Invoice, None, queue="mail")
settle = cyclone.define("settle", Invoice)
settle.node(notify_customer)


@cyclone.step("invoice.send")
async def send_invoice(ctx: cyclone.Context, invoice: Invoice) -> str:
    reservation = await ctx.output("reserve")
    conn = await ctx.completion_tx()
    await conn.execute("UPDATE orders SET invoiced = true WHERE id = $1", invoice.order_id)
    await cyclone.enqueue_completion(ctx, ctx.client, notify_customer, invoice, priority=3)
    await cyclone.submit_completion(ctx, ctx.client, settle, invoice)
    return f"invoiced from {reservation}"


async def test_handler_with_a_recorder() -> None:
    recorder = TxRecorder()
    ctx = new_context(completion_tx=recorder, outputs={"reserve": "north"}, attempt=2)
    assert await send_invoice(ctx, Invoice(7, 100)) == "invoiced from north"
    assert [(q.method, q.args) for q in recorder.queries] == [("execute", (7,))]
    [job] = recorder.enqueued
    assert (job.kind, job.input, job.options.priority) == ("customer.notify", Invoice(7, 100), 3)
    [run] = recorder.submitted
    assert (run.workflow, run.input, run.key) == ("settle", Invoice(7, 100), None)
    assert ctx.attempt == 2


async def test_recorded_enqueues_are_still_checked() -> None:
    ctx = new_context(completion_tx=TxRecorder())
    with pytest.raises(cyclone.InvalidInputError):
        await cyclone.enqueue_completion(ctx, ctx.client, notify_customer, "not an invoice")
    with pytest.raises(cyclone.InvalidKeyError):
        await cyclone.enqueue_completion(ctx, ctx.client, notify_customer, Invoice(1, 1), unique="")
    with pytest.raises(cyclone.InvalidInputError, match="unknown option"):
        await cyclone.submit_completion(ctx, ctx.client, settle, Invoice(1, 1), unique="k")


async def test_context_without_a_completion_transaction() -> None:
    ctx = new_context()
    with pytest.raises(cyclone.ContextError):
        await ctx.completion_tx()
    with pytest.raises(cyclone.UnknownKindError):
        await ctx.output("missing")


# Handlers that grow runs: a submit of a workflow with a map node, and a handler after one.


@cyclone.step("batch.line")
async def price_line(ctx: cyclone.Context, cents: int) -> int:
    return cents * 2


@cyclone.step("batch.total")
async def total_lines(ctx: cyclone.Context, order: Invoice) -> int:
    lines = await ctx.output("lines")  # the map node's output: its items' outputs in order
    return sum(lines)


batch = cyclone.define("batch", list[int])
batch.map(price_line, name="lines", max_items=3)


@cyclone.step("batch.start")
async def start_batch(ctx: cyclone.Context, lines: list[int]) -> None:
    await cyclone.submit_completion(ctx, ctx.client, batch, lines)


async def test_a_recorded_submit_of_a_map_workflow_is_checked_against_its_bound() -> None:
    recorder = TxRecorder()
    ctx = new_context(completion_tx=recorder)
    await start_batch(ctx, [1, 2, 3])
    [run] = recorder.submitted
    assert (run.workflow, run.input) == ("batch", [1, 2, 3])
    with pytest.raises(cyclone.InvalidInputError, match="over its max_items of 3"):
        await start_batch(ctx, [1, 2, 3, 4])
    assert len(recorder.submitted) == 1  # the refused submit recorded nothing


async def test_a_handler_after_a_map_node_gets_its_list_and_an_item_its_element() -> None:
    after = new_context(outputs={"lines": [2, 4, 6]}, node="total")
    assert await total_lines(after, Invoice(1, 1)) == 12
    item = new_context(node="lines[1]")
    assert await price_line(item, 2) == 4 and item.node == "lines[1]"


@cyclone.step("invoice.total")
def total_invoice(ctx: cyclone.Context, invoice: Invoice) -> str:
    reservation = anyio.from_thread.run(ctx.output, "reserve")
    anyio.from_thread.run(cyclone.enqueue_completion, ctx, ctx.client, notify_customer, invoice)
    return f"{invoice.cents} from {reservation} in a thread: {not _in_main_thread()}"


def _in_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


async def test_a_sync_handler_runs_in_a_thread_when_called() -> None:
    recorder = TxRecorder()
    ctx = new_context(completion_tx=recorder, outputs={"reserve": "north"})
    assert total_invoice.is_sync
    assert await total_invoice(ctx, Invoice(7, 100)) == "100 from north in a thread: True"
    assert [job.kind for job in recorder.enqueued] == ["customer.notify"]
    assert not ctx.cancelled
    ctx.raise_if_cancelled()  # not cancelled: returns


def test_generator_handlers_are_refused() -> None:
    def gen(ctx: cyclone.Context, n: int) -> Iterator[int]:
        yield n

    async def agen(ctx: cyclone.Context, n: int) -> AsyncIterator[int]:
        yield n

    for handler in (gen, agen):
        with pytest.raises(cyclone.InvalidInputError, match="is a generator: a handler returns"):
            cyclone.step("gen")(handler)
