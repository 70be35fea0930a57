"""The plans of the insert path, without a database: what an enqueue or a submit would write,
and the bad input refused before any statement is sent."""

from __future__ import annotations

import datetime as dt
import uuid

import pytest

import cyclone
from cyclone._enqueue.insert import plan_jobs
from cyclone._model.codec import DEFAULT_PAYLOAD_LIMIT

flow = cyclone.define_result("plan.flow", int, int)


@cyclone.step("plan.a", queue="q1", max_attempts=4)
async def a(ctx: cyclone.Context, n: int) -> int:
    return n


@cyclone.step("plan.b", queue="q2")
async def b(ctx: cyclone.Context, n: int) -> int:
    return n


first = flow.node(a, name="first")
gate = flow.wait("gate", after=[first], timeout=dt.timedelta(minutes=5))
last = flow.node(b, name="last", after=[first, gate])
flow.set_result(last)


def test_a_job_plan_has_an_encoded_input_and_a_time_ordered_id_each() -> None:
    plan = plan_jobs(None, a, [1, 2, 3], {"priority": 2})
    assert plan.encoded == "[1,2,3]"
    assert plan.queue == "q1" and plan.options.priority == 2
    assert len(set(plan.ids)) == 3 and plan.ids == sorted(plan.ids)
    assert all(isinstance(i, uuid.UUID) and i.version == 7 for i in plan.ids)


def test_a_job_plan_takes_the_queue_of_its_options() -> None:
    assert plan_jobs(None, a, [1], {"queue": "other"}).queue == "other"


@pytest.mark.parametrize(
    ("inputs", "options", "error"),
    [
        (["x"], {}, cyclone.InvalidInputError),  # not an int
        ([1, 2], {"unique": "k"}, cyclone.InvalidInputError),  # unique= on a batch
        ([1], {"priority": "high"}, cyclone.InvalidInputError),
        ([1], {"nope": 1}, cyclone.InvalidInputError),
    ],
)
def test_a_job_plan_refuses_bad_input(
    inputs: list[object], options: dict[str, object], error: type[Exception]
) -> None:
    with pytest.raises(error):
        plan_jobs(None, a, inputs, options)


def test_a_submit_plan_lists_the_nodes_edges_and_root_queues() -> None:
    plan = flow.plan(DEFAULT_PAYLOAD_LIMIT, "order-1", 5, {})
    names, kinds, queues, attempts, deps, timeouts = plan.nodes
    assert names == ["first", "gate", "last"]
    assert kinds == ["plan.a", None, "plan.b"]  # a wait node runs no kind
    assert queues[0] == "q1" and queues[2] == "q2"
    assert attempts == [4, 1, b.max_attempts]
    assert deps == [0, 1, 2]
    assert timeouts[1] == 300.0 and timeouts[0] is None  # seconds
    assert sorted(zip(*plan.edges, strict=True)) == [
        ("first", "gate"),
        ("first", "last"),
        ("gate", "last"),
    ]
    assert plan.queues == ["q1"]  # only the root is released at commit
    assert (plan.encoded, plan.key, plan.result_node, plan.node_count) == (
        "5",
        "order-1",
        "last",
        3,
    )


@pytest.mark.parametrize(
    ("key", "input", "options"),
    [
        ("", 1, {}),  # an empty key
        (None, "x", {}),  # input of the wrong type
        (None, 1, {"unique": "k"}),  # not a submit option
    ],
)
def test_a_submit_plan_refuses_bad_input(
    key: str | None, input: object, options: dict[str, object]
) -> None:
    with pytest.raises(cyclone.CycloneError):
        flow.plan(DEFAULT_PAYLOAD_LIMIT, key, input, options)  # type: ignore[arg-type]


def test_an_empty_workflow_has_no_plan() -> None:
    with pytest.raises(cyclone.InvalidInputError, match="has no nodes"):
        cyclone.define("plan.empty", int).plan(DEFAULT_PAYLOAD_LIMIT, None, 1, {})
