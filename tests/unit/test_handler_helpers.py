"""Handlers run as plain coroutines with cyclone.testing: no worker, no database."""

from __future__ import annotations

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
