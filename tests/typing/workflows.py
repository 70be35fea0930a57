"""Workflows: nodes carry their step's output type, result nodes and submits are checked."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from typing import Any, assert_type

import msgspec

import cyclone


class Order(msgspec.Struct):
    order_id: int
    cents: int


@cyclone.step("order.reserve")
async def reserve(ctx: cyclone.Context, order: Order) -> str:
    return "north"


@cyclone.step("order.charge")
async def charge(ctx: cyclone.Context, order: Order) -> int:
    return order.cents


@cyclone.step("order.label")
async def label(ctx: cyclone.Context, warehouse: str) -> bytes:
    return warehouse.encode()


@cyclone.step("order.big")
async def is_big(ctx: cyclone.Context, order: Order) -> bool:
    return order.cents > 100


def to_warehouse(order: Order, outputs: Mapping[str, Any]) -> str:
    return str(outputs["order.reserve"])


checkout = cyclone.define_result("checkout", Order, int)
reserved = checkout.node(reserve)
charged = checkout.node(charge, after=[reserved])
labelled = checkout.node(label, after=[reserved], input=to_warehouse)
waited = checkout.wait("approved", after=[charged], timeout=60.0)
cooled = checkout.sleep("cool", after=[charged], sleep=dt.timedelta(minutes=5))
checkout.set_result(charged)

plain = cyclone.define("plain", Order)

# A node of a narrower output type can be the result (a bool is an int).
sized = cyclone.define_result("sized", Order, int)
sized.set_result(sized.node(is_big))


def nodes() -> None:
    assert_type(checkout, cyclone.ResultWorkflow[Order, int])
    assert_type(plain, cyclone.Workflow[Order])
    assert_type(reserved, cyclone.Node[str])
    assert_type(charged, cyclone.Node[int])
    assert_type(labelled, cyclone.Node[bytes])
    assert_type(waited, cyclone.Node[Any])
    assert_type(cooled, cyclone.Node[dt.datetime])
    assert_type(checkout.get_node("order.charge"), cyclone.Node[Any] | None)
    assert_type(cyclone.define_result("r", Order, int | None), cyclone.ResultWorkflow[Any, Any])


def wrong_nodes() -> None:
    checkout.set_result(reserved)  # type: ignore[arg-type]
    checkout.node(label)  # type: ignore[arg-type]
    checkout.sleep("later", until="tomorrow")  # type: ignore[arg-type]
    checkout.node(charge, input=to_warehouse)  # type: ignore[arg-type]
    checkout.node(charge, after=[1])  # type: ignore[list-item]


async def submits(client: cyclone.Client, tx: cyclone.Tx, order: Order) -> None:
    assert_type(await checkout.submit(client, order), cyclone.ResultRun[int])
    assert_type(await checkout.submit_tx(client, tx, order), cyclone.ResultRun[int])
    assert_type(await checkout.submit_once(client, "k", order), tuple[cyclone.ResultRun[int], bool])
    assert_type(
        await checkout.submit_once_tx(client, tx, "k", order), tuple[cyclone.ResultRun[int], bool]
    )
    assert_type(await plain.submit(client, order), cyclone.Run)
    assert_type(await plain.submit_once(client, "k", order), tuple[cyclone.Run, bool])
    assert_type(await cyclone.submit_tx(client, tx, checkout, order), cyclone.ResultRun[int])
    assert_type(await cyclone.submit_tx(client, tx, plain, order), cyclone.Run)
    run = await checkout.submit(
        client,
        order,
        process_at=dt.datetime.now(dt.UTC),
        priority=1,
        run_deadline=dt.datetime.now(dt.UTC),
    )
    assert_type(await run.result(timeout=5), int)
    options: cyclone.SubmitOptions = {"process_in": dt.timedelta(minutes=1)}
    await plain.submit_once(client, "k", order, **options)


async def wrong_submits(client: cyclone.Client, tx: cyclone.Tx, order: Order) -> None:
    await checkout.submit(client, order, priority="high")  # type: ignore[arg-type]
    await checkout.submit(client, order, queue="orders")  # type: ignore[call-arg]
    await checkout.submit(client, order, expires_in=60)  # type: ignore[call-arg]
    await plain.submit_once(client, "k", order, unique="k")  # type: ignore[call-arg]
    await plain.submit(client, {"order_id": 1})  # type: ignore[arg-type]
    await cyclone.submit_tx(client, tx, plain, order, max_attempts=3)  # type: ignore[call-overload]
    await plain.submit(None, order)  # type: ignore[arg-type]


# Runtime shapes: a map's output is a list of its step's output; a branch value is of the
# node's output type.


@cyclone.step("order.lines")
async def lines(ctx: cyclone.Context, order: Order) -> list[int]:
    return [order.cents]


@cyclone.step("order.price")
async def price(ctx: cyclone.Context, cents: int) -> str:
    return str(cents)


@cyclone.step("order.sum")
async def sum_prices(ctx: cyclone.Context, prices: list[str]) -> int:
    return len(prices)


shaped = cyclone.define_result("shaped", Order, list[str])
listed = shaped.node(lines)
priced = shaped.map(price, listed, max_parallel=4)
settled = shaped.map(price, listed, name="settled", settle=True)
big = shaped.node(is_big)
shipped = shaped.node(label, after=[big.when(True)], input=to_warehouse, join="any")
shaped.set_result(priced)

over_input = cyclone.define_result("over_input", list[int], list[str])
over_input.set_result(over_input.map(price))


def shapes() -> None:
    assert_type(priced, cyclone.Node[list[str]])
    assert_type(settled, cyclone.Node[list[cyclone.Settled[str]]])
    assert_type(over_input.map(price, name="again"), cyclone.Node[list[str]])
    assert_type(big.when(False), cyclone.Branch)
    assert_type(shipped, cyclone.Node[bytes])


def wrong_shapes() -> None:
    shaped.map(price, reserved)  # type: ignore[misc]
    shaped.map(price)  # type: ignore[call-overload]
    shaped.map(label, listed)  # type: ignore[misc]
    shaped.set_result(settled)  # type: ignore[arg-type]
    big.when("yes")  # type: ignore[arg-type]
    shaped.node(label, after=[big], input=to_warehouse, join="some")  # type: ignore[call-overload]


# Child workflows: a child node's output is the child workflow's result type.

child_flow = cyclone.define_result("child_flow", Order, int)
child_flow.set_result(child_flow.node(charge))
plain_child = cyclone.define("plain_child", str)
plain_child.node(label, input=lambda warehouse, _: warehouse)

parent_flow = cyclone.define_result("parent_flow", Order, int)
charged_child = parent_flow.child(child_flow, max_attempts=3)
plain_done = parent_flow.child(plain_child, input=to_warehouse, after=[charged_child])
parent_flow.set_result(charged_child)


def children() -> None:
    assert_type(charged_child, cyclone.Node[int])
    assert_type(plain_done, cyclone.Node[None])


def wrong_children() -> None:
    parent_flow.child(plain_child)  # type: ignore[arg-type]
    parent_flow.set_result(plain_done)  # type: ignore[arg-type]
    sized.child(child_flow, input=to_warehouse)  # type: ignore[arg-type]


# A map over a child workflow: its output is the list of the child runs' results.
charged_each = cyclone.define("charged_each", list[Order])
charged_all = charged_each.map(child_flow, max_parallel=5)


def mapped_children() -> None:
    assert_type(charged_all, cyclone.Node[list[int]])
    assert_type(
        charged_each.map(child_flow, name="s", settle=True),
        cyclone.Node[list[cyclone.Settled[int]]],
    )
    shaped.map(child_flow, listed)  # type: ignore[misc]


# Typed wait nodes: the payload type is the node's; an any-of node's output is an Event.
class Approval(msgspec.Struct):
    by: str


class Papers(msgspec.Struct):
    passport: str
    address: str


review = cyclone.define("review", Order)
approved = review.wait("approval", payload=Approval)
decided = review.wait_any("decision", events={"approved": Approval, "rejected": str})
papers = review.wait_all("papers", events=Papers)
labels = review.wait("labels", payload=list[str])


def typed_waits() -> None:
    assert_type(approved, cyclone.Node[Approval])
    assert_type(decided, cyclone.EventNode[Any])
    assert_type(papers, cyclone.Node[Papers])
    assert_type(review.wait_all("forms", events={"tax": str}), cyclone.Node[dict[str, Any]])
    review.node(label, after=[decided.when("approved")], input=lambda o, out: "north")
    review.map(label, labels)


async def typed_signal(client: cyclone.Client, ctx: cyclone.Context) -> None:
    await client.signal(ctx.run_id, "decision", Approval("ops"), event="approved")
    event = await ctx.output(decided)
    assert_type(event, cyclone.Event[Any])
    assert_type(event.name, str)
    assert_type(await ctx.output(approved), Approval)
