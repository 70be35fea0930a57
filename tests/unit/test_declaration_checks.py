"""What a declaration refuses before any run exists, and the messages of a payload that does
not match its declared type: in the user's words (the kind, input or output, the type as it
is written), not msgspec's internal path or a class repr."""

from __future__ import annotations

import dataclasses
import datetime as dt
import typing
import uuid
from typing import Any

import asyncpg
import msgspec
import pytest

import cyclone
from cyclone._enqueue import insert
from cyclone.testing import TxRecorder, new_context

SUPPORTED = "builtins (int, float, str, bool, None, list, dict, tuple)"


class Order(msgspec.Struct):
    cents: int
    items: list[str] = []


@dataclasses.dataclass
class WithPool:
    pool: asyncpg.Pool


class Tree(msgspec.Struct):
    children: list[Tree]


class Point(typing.TypedDict):
    x: int


ORDER = f"{__name__}.Order"


@cyclone.step("checks.add")
async def add(ctx: cyclone.Context, n: int) -> int:
    return n


@cyclone.step("checks.order")
async def take_order(ctx: cyclone.Context, order: Order) -> None:
    return None


@cyclone.action("checks.act")
async def act(ctx: cyclone.Context, n: int) -> None:
    return None


# An action annotated to return something


def test_an_action_annotated_to_return_a_value_is_refused() -> None:
    async def act_int(ctx: cyclone.Context, n: int) -> int:
        return n

    with pytest.raises(cyclone.InvalidInputError) as raised:
        cyclone.action("checks.act_int")(act_int)  # type: ignore[arg-type]
    assert str(raised.value) == (
        "action 'checks.act_int' is annotated -> int, but an action returns None (it has no "
        "output): annotate it -> None, or declare it with @cyclone.step to keep its output"
    )


def test_an_action_annotated_to_return_none_is_accepted() -> None:
    assert act.output_type is type(None)


# Types msgspec cannot store


def test_an_input_type_msgspec_cannot_encode_is_refused_by_every_declaration() -> None:
    async def use_pool(ctx: cyclone.Context, pool: asyncpg.Pool) -> None:
        return None

    message = (
        "input of step 'checks.pool' is declared as asyncpg.pool.Pool, which msgspec cannot "
        "encode as JSON, the form inputs and outputs are stored in: use " + SUPPORTED
    )
    declarations = [
        lambda: cyclone.step("checks.pool")(use_pool),
        lambda: cyclone.action("checks.pool")(use_pool),
        lambda: cyclone.register_kind("checks.pool", asyncpg.Pool, None),
    ]
    for declare in declarations:
        with pytest.raises(cyclone.InvalidInputError) as raised:
            declare()
        assert str(raised.value).startswith(message), str(raised.value)
        assert "an id, a name" in str(raised.value)


def test_an_output_type_msgspec_cannot_encode_is_refused() -> None:
    async def make_pool(ctx: cyclone.Context, dsn: str) -> asyncpg.Pool:
        raise NotImplementedError

    with pytest.raises(cyclone.InvalidInputError, match=r"^output of step 'checks\.make_pool' is"):
        cyclone.step("checks.make_pool")(make_pool)
    with pytest.raises(cyclone.InvalidInputError, match=r"^output of step 'checks\.k' is declared"):
        cyclone.register_kind("checks.k", int, asyncpg.Pool)


def test_a_type_that_holds_one_msgspec_cannot_encode_names_it() -> None:
    with pytest.raises(cyclone.InvalidInputError) as raised:
        cyclone.register_kind("checks.holder", WithPool, None)
    assert str(raised.value).startswith(
        f"input of step 'checks.holder' is declared as {__name__}.WithPool (it holds "
        "asyncpg.pool.Pool), which msgspec cannot encode as JSON"
    )
    with pytest.raises(cyclone.InvalidInputError, match=r"list\[asyncpg.pool.Pool\] \(it holds"):
        cyclone.register_kind("checks.holder", list[asyncpg.Pool], None)


def test_workflow_inputs_and_results_are_checked_at_definition() -> None:
    with pytest.raises(cyclone.InvalidInputError, match=r"^input of workflow 'checks\.wf' is"):
        cyclone.define("checks.wf", asyncpg.Pool)
    with pytest.raises(cyclone.InvalidInputError, match=r"^result of workflow 'checks\.wf' is"):
        cyclone.define_result("checks.wf", int, asyncpg.Pool)


@pytest.mark.parametrize(
    "tp",
    [
        int,
        str | None,
        list[int],
        dict[str, list[float]],
        tuple[int, ...],
        Order,
        Tree,
        Point,
        typing.Literal["a", "b"],
        dt.datetime,
        uuid.UUID,
        Any,
        object,
        None,
    ],
)
def test_types_msgspec_stores_are_accepted(tp: Any) -> None:
    kind = cyclone.register_kind("checks.ok", tp, tp)
    assert kind.input_type is tp


# A payload of the wrong type


def _recording(recorder: TxRecorder | None = None) -> cyclone.Context:
    """A unit test's context with a recorder and no client: inputs are checked for real."""
    return new_context(completion_tx=recorder or TxRecorder())


async def test_an_input_of_the_wrong_type_says_the_step_and_the_types() -> None:
    with pytest.raises(cyclone.InvalidInputError) as raised:
        await cyclone.enqueue_completion(_recording(), None, add, "two")  # type: ignore[arg-type]
    assert str(raised.value) == "input of step 'checks.add' must be int: got str"


async def test_a_field_of_the_wrong_type_is_named_by_its_own_path() -> None:
    with pytest.raises(cyclone.InvalidInputError) as raised:
        await cyclone.enqueue_completion(_recording(), None, take_order, {"cents": "3"})  # type: ignore[arg-type]
    assert str(raised.value) == f"input of step 'checks.order' must be {ORDER}: got dict"
    recorder = TxRecorder()
    kind = cyclone.register_kind("checks.points", list[Point], None)
    with pytest.raises(cyclone.InvalidInputError) as raised:
        await cyclone.enqueue_completion(_recording(recorder), None, kind, [{"x": 1}, {"x": "2"}])  # type: ignore[arg-type]
    assert str(raised.value) == (
        f"input of step 'checks.points' must be list[{__name__}.Point]: expected `int`, got "
        "`str` at `[1].x`"
    )
    assert recorder.enqueued == []


async def test_a_batch_says_which_input_does_not_match() -> None:
    with pytest.raises(cyclone.InvalidInputError) as raised:
        await insert.Inserter(None).enqueue(TxRecorder(), add, [1, 2, "3"], {})
    assert str(raised.value) == "input of step 'checks.add' at index 2 must be int: got str"


async def test_an_output_of_the_wrong_type_says_what_it_must_be() -> None:
    from cyclone._model import codec

    with pytest.raises(cyclone.InvalidInputError) as raised:
        codec.encode(3, type(None), what="output of step 'checks.act'", limit=1000)
    assert str(raised.value) == "output of step 'checks.act' must be None: got int"


def test_a_workflow_node_of_another_input_type_names_the_types() -> None:
    wf = cyclone.define("checks.strings", list[str])
    with pytest.raises(cyclone.InvalidInputError) as raised:
        wf.node(add)
    assert str(raised.value).startswith(
        "step 'checks.add' takes int, not the workflow input list[str]: pass input="
    )


# Schedules


def test_a_schedule_without_input_says_input_is_required() -> None:
    with pytest.raises(cyclone.InvalidScheduleError) as raised:
        cyclone.schedule("checks.nightly", add, cron="0 3 * * *")
    assert str(raised.value) == (
        "input= is required: schedule 'checks.nightly' runs 'checks.add', which takes int; "
        "pass input=VALUE, or a function of the slot's time that returns it "
        "(input=lambda slot: ...)"
    )


def test_a_schedule_of_a_kind_that_takes_none_needs_no_input() -> None:
    optional = cyclone.register_kind("checks.optional", int | None, None)
    assert cyclone.schedule("checks.opt", optional, every=60).encoded_input == "null"


@pytest.mark.parametrize(
    ("cron", "problem"),
    [
        ("61 * * * *", "minute 61 is out of range 0-59"),
        ("0 24 * * *", "hour 24 is out of range 0-23"),
        ("0 0 0 * *", "day-of-month 0 is out of range 1-31"),
        ("0 0 * 13 *", "month 13 is out of range 1-12"),
        ("0 0 * * 1-9", "day-of-week 9 is out of range 0-7"),
        ("*/0 * * * *", "minute '*/0' is not valid: a field takes numbers 0-59, '*', lists"),
        ("0 0 31 2 *", "day-of-month 31 never occurs in month '2'"),
        ("x * * * *", "minute 'x' is not valid: a field takes numbers 0-59, '*', lists"),
    ],
)
def test_a_bad_cron_field_is_named_with_its_value_and_range(cron: str, problem: str) -> None:
    with pytest.raises(cyclone.InvalidScheduleError) as raised:
        cyclone.schedule("checks.cron", add, cron=cron, input=1)
    assert str(raised.value).startswith(f"invalid cron expression {cron!r}: {problem}")


# RunFailedError


def test_run_failed_error_says_the_cause_in_a_line_without_the_traceback() -> None:
    run_id = uuid.UUID("0193a7c2-0000-7000-8000-000000000001")
    tb = 'Traceback (most recent call last):\n  File "app.py", line 3\nValueError: boom\n'
    stored = {"attempt": 3, "type": "ValueError", "message": "boom", "traceback": tb, "at": "x"}
    error = cyclone.RunFailedError(run_id, stored)
    assert str(error) == f"run {run_id} failed: ValueError: boom (attempt 3)"
    assert error.error is stored and error.traceback == tb
    node = cyclone.RunFailedError(run_id, {**stored, "node": "charge"})
    assert str(node) == f"run {run_id} failed: ValueError: boom (node 'charge', attempt 3)"
    deadline = cyclone.RunFailedError(
        run_id, {"type": "DeadlineExceeded", "message": "the run passed its deadline"}
    )
    assert str(deadline) == (f"run {run_id} failed: DeadlineExceeded: the run passed its deadline")
    assert deadline.traceback is None
    assert str(cyclone.RunFailedError(run_id, None)) == f"run {run_id} failed"


# The package-level calls given something that is not a step or a workflow


async def test_package_level_enqueues_refuse_a_kind_name() -> None:
    recorder = TxRecorder()
    client: Any = None
    expected = (
        "takes a step (from @cyclone.step or @cyclone.action) or a kind from "
        "cyclone.register_kind(...), got str 'demo.unknown': pass the step itself, or declare "
        "the kind in this process with cyclone.register_kind('demo.unknown', InputType, "
        "OutputType) and pass that"
    )
    calls = {
        "enqueue": lambda: cyclone.enqueue(client, "demo.unknown", 1),  # type: ignore[arg-type]
        "enqueue_tx": lambda: cyclone.enqueue_tx(client, recorder, "demo.unknown", 1),  # type: ignore[arg-type]
        "enqueue_many": lambda: cyclone.enqueue_many(client, "demo.unknown", [1]),  # type: ignore[arg-type]
        "enqueue_many_tx": lambda: cyclone.enqueue_many_tx(client, recorder, "demo.unknown", [1]),  # type: ignore[arg-type]
        "enqueue_completion": lambda: cyclone.enqueue_completion(
            new_context(completion_tx=recorder),
            client,
            "demo.unknown",  # type: ignore[arg-type]
            1,
        ),
    }
    for call, make in calls.items():
        with pytest.raises(cyclone.InvalidInputError) as raised:
            await make()
        assert str(raised.value) == f"cyclone.{call}() {expected}"
    assert recorder.enqueued == [] and recorder.submitted == []


async def test_package_level_calls_say_what_to_use_instead() -> None:
    recorder = TxRecorder()
    client: Any = None
    wf = cyclone.define("checks.flow", int)
    wf.node(add)
    with pytest.raises(cyclone.InvalidInputError, match="a workflow is submitted, not enqueued"):
        await cyclone.enqueue(client, wf, 1)  # type: ignore[arg-type]
    with pytest.raises(cyclone.InvalidInputError, match=r"decorate the function with @cyclone"):
        await cyclone.enqueue(client, add.handler, 1)  # type: ignore[arg-type]
    with pytest.raises(cyclone.InvalidInputError) as raised:
        await cyclone.submit_tx(client, recorder, "checks.flow", 1)  # type: ignore[call-overload]
    assert str(raised.value) == (
        "cyclone.submit_tx() takes a workflow from cyclone.define(...) or "
        "cyclone.define_result(...), got str 'checks.flow': pass the workflow object itself"
    )
    with pytest.raises(cyclone.InvalidInputError) as raised:
        await cyclone.submit_completion(new_context(completion_tx=recorder), client, add, 1)  # type: ignore[call-overload]
    assert str(raised.value).endswith(
        "a step is enqueued, not submitted: use cyclone.enqueue_completion"
    )
    assert recorder.enqueued == [] and recorder.submitted == []


async def test_a_handle_from_a_recorded_enqueue_says_it_has_no_run_to_read() -> None:
    recorder = TxRecorder()
    run = await cyclone.enqueue_completion(_recording(recorder), None, add, 2)  # type: ignore[arg-type]
    assert [e.run_id for e in recorder.enqueued] == [run.id]
    with pytest.raises(cyclone.ContextError, match="recorded by a TxRecorder, not written"):
        await run.status()
