"""Workflows shaped at run time: map nodes over a list, and branches with skipped nodes."""

from __future__ import annotations

import asyncio
from typing import Any, Literal

import pytest

import cyclone
from cyclone.testing.plugin import CycloneEnv
from tests.conftest import Probe, count_rows, fast_worker

probe = Probe()


@pytest.fixture(autouse=True)
def _reset_probe() -> None:
    probe.reset()


@cyclone.step("dyn.split")
async def split(ctx: cyclone.Context, n: int) -> list[int]:
    return list(range(n))


@cyclone.step("dyn.square", max_attempts=2)
async def square(ctx: cyclone.Context, x: int) -> int:
    probe.calls.append((ctx.node, x))
    if x < 0:
        raise ValueError(f"negative item {x}")
    return x * x


@cyclone.step("dyn.total")
async def total(ctx: cyclone.Context, parts: list[int]) -> int:
    return sum(parts)


@cyclone.step("dyn.gate")
async def gate(ctx: cyclone.Context, x: int) -> int:
    """Holds each item until the test lets it go; ``started`` is set once three run."""
    probe.calls.append(x)
    if len(probe.calls) == 3:
        probe.started.set()
    await probe.stopped.wait()
    return x


def squares_of_split() -> cyclone.ResultWorkflow[int, int]:
    wf = cyclone.define_result("dyn.squares", int, int)
    parts = wf.node(split)
    squares = wf.map(square, parts, name="squares")
    summed = wf.node(total, after=[squares], input=lambda _i, o: o["squares"])
    wf.set_result(summed)
    return wf


squares_wf = squares_of_split()


async def test_map_over_a_parents_output_collects_results_in_item_order(
    cyclone_env: CycloneEnv,
) -> None:
    run = await squares_wf.submit(cyclone_env.client, 5)
    async with fast_worker(cyclone_env.client, workflows=[squares_wf]):
        assert await run.result(timeout=30) == sum(x * x for x in range(5))
    info = await run.info()
    states = {n.name: n.state for n in info.nodes}
    assert states["squares"] == "completed"
    assert [states[f"squares[{i}]"] for i in range(5)] == ["completed"] * 5
    assert sorted(x for _, x in probe.calls) == [0, 1, 2, 3, 4]
    assert {node for node, _ in probe.calls} == {f"squares[{i}]" for i in range(5)}
    payloads = await run.payloads()
    assert payloads.nodes["squares"].output == [0, 1, 4, 9, 16]
    assert await count_rows(cyclone_env, "cyclone_tasks") == 0


async def test_an_empty_list_completes_the_map_at_once(cyclone_env: CycloneEnv) -> None:
    run = await squares_wf.submit(cyclone_env.client, 0)
    async with fast_worker(cyclone_env.client, workflows=[squares_wf]):
        assert await run.result(timeout=30) == 0
    assert probe.calls == []


over_input = cyclone.define_result("dyn.over_input", list[int], list[int])
over_input.set_result(over_input.map(square, name="sq", max_parallel=2))


async def test_a_root_map_over_the_run_input_expands_at_submit(cyclone_env: CycloneEnv) -> None:
    run = await over_input.submit(cyclone_env.client, [3, 1, 2])
    # The items exist (and two are queued) as soon as the submit returns.
    assert await count_rows(cyclone_env, "cyclone_steps", "map_of = 'sq'") == 3
    assert await count_rows(cyclone_env, "cyclone_tasks") == 2
    async with fast_worker(cyclone_env.client, workflows=[over_input]):
        assert await run.result(timeout=30) == [9, 1, 4]
    empty = await over_input.submit(cyclone_env.client, [])
    assert await empty.result(timeout=30) == []


async def test_a_root_maps_items_wait_for_the_runs_process_at(cyclone_env: CycloneEnv) -> None:
    await over_input.submit(cyclone_env.client, [1, 2], process_in=3600)
    assert await count_rows(cyclone_env, "cyclone_tasks", "available_at > now() + '50 min'") == 2


gated = cyclone.define("dyn.gated", list[int])
gated.map(gate, name="g", max_parallel=3)


async def test_max_parallel_caps_the_items_running_at_once(cyclone_env: CycloneEnv) -> None:
    run = await gated.submit(cyclone_env.client, list(range(10)))
    async with fast_worker(cyclone_env.client, workflows=[gated], queues={"default": 8}):
        await asyncio.wait_for(probe.started.wait(), 30)
        # Three items run and the worker has five slots free, but the other seven items have
        # no task to claim: they are released only as running ones finish.
        assert await count_rows(cyclone_env, "cyclone_tasks") == 3
        assert (
            await count_rows(cyclone_env, "cyclone_steps", "map_of = 'g' AND state = 'pending'")
            == 7
        )
        probe.stopped.set()
        await run.wait(timeout=30)
    assert await run.status() is cyclone.RunState.COMPLETED
    # Released in item order: the first three first.
    assert sorted(probe.calls[:3]) == [0, 1, 2]
    assert sorted(probe.calls) == list(range(10))


settling = cyclone.define_result("dyn.settling", list[int], list[cyclone.Settled[int]])
settling.set_result(settling.map(square, name="sq", settle=True))


async def test_a_settling_map_hands_on_each_items_value_or_error(
    cyclone_env: CycloneEnv,
) -> None:
    run = await settling.submit(cyclone_env.client, [2, -1, 3])
    async with fast_worker(cyclone_env.client, workflows=[settling]):
        results = await run.result(timeout=30)
    assert [r.ok for r in results] == [True, False, True]
    assert [r.value for r in results] == [4, None, 9]
    error = results[1].error
    assert error is not None and error["type"] == "ValueError"
    assert "negative item -1" in error["message"] and error["attempt"] == 2


failing = cyclone.define("dyn.failing", list[int])
failing.map(square, name="sq")


async def test_an_exhausted_item_fails_the_run_and_a_retry_resumes_the_map(
    cyclone_env: CycloneEnv,
) -> None:
    run = await failing.submit(cyclone_env.client, [1, -1, 2])
    async with fast_worker(cyclone_env.client, workflows=[failing]):
        assert await run.wait(timeout=30) is cyclone.RunState.FAILED
        states = {n.name: n.state for n in (await run.info()).nodes}
        assert states["sq[1]"] == "failed"
        assert states["sq"] == "waiting"
        # The item's input is stored: fix it in place as an operator would, and retry.
        await cyclone_env.pool.execute(
            "UPDATE public.cyclone_steps SET input = '5' WHERE node = 'sq[1]' AND run_id = $1",
            run.id,
        )
        await run.retry_all()
        await run.wait(timeout=30)
    assert await run.status() is cyclone.RunState.COMPLETED
    payloads = await run.payloads()
    assert payloads.nodes["sq"].output == [1, 25, 4]


async def test_a_list_past_max_items_is_refused_at_submit_and_fails_the_node_at_run_time(
    cyclone_env: CycloneEnv,
) -> None:
    small = cyclone.define("dyn.small", list[int])
    small.map(square, name="sq", max_items=2)
    with pytest.raises(cyclone.InvalidInputError, match="max_items of 2"):
        await small.submit(cyclone_env.client, [1, 2, 3])
    assert await count_rows(cyclone_env, "cyclone_runs") == 0

    grown = cyclone.define("dyn.grown", int)
    grown.map(square, grown.node(split), name="sq", max_items=2)
    run = await grown.submit(cyclone_env.client, 3)
    async with fast_worker(cyclone_env.client, workflows=[grown]):
        assert await run.wait(timeout=30) is cyclone.RunState.FAILED
    info = await run.info()
    assert info.error is not None and "max_items of 2" in info.error["message"]
    assert await count_rows(cyclone_env, "cyclone_steps", "map_of IS NOT NULL") == 0


@cyclone.step("dyn.echo")
async def echo(ctx: cyclone.Context, value: Any) -> Any:
    return value


async def test_a_root_map_over_an_input_that_is_no_list_fails_its_run(
    cyclone_env: CycloneEnv,
) -> None:
    loose = cyclone.define("dyn.loose", Any)
    loose.map(echo, name="sq")
    run = await loose.submit(cyclone_env.client, {"not": "a list"})
    assert await run.status() is cyclone.RunState.FAILED  # in the submit's transaction
    info = await run.info()
    assert info.error is not None and info.error["type"] == "MapTooLargeError"
    assert "not a list" in info.error["message"]


# Branches

Verdict = Literal["ok", "refund"]


@cyclone.step("dyn.check")
async def check(ctx: cyclone.Context, amount: int) -> Verdict:
    return "refund" if amount < 0 else "ok"


@cyclone.step("dyn.ship")
async def ship(ctx: cyclone.Context, amount: int) -> str:
    probe.calls.append("ship")
    return "shipped"


@cyclone.step("dyn.refund")
async def refund(ctx: cyclone.Context, amount: int) -> str:
    probe.calls.append("refund")
    return "refunded"


@cyclone.step("dyn.notify")
async def notify(ctx: cyclone.Context, amount: int) -> str:
    probe.calls.append("notify")
    return "notified"


orders = cyclone.define("dyn.orders", int)
o_check = orders.node(check)
o_ship = orders.node(ship, after=[o_check.when("ok")])
o_refund = orders.node(refund, after=[o_check.when("refund")])
# After both branches: runs when either ran (join="any"); the default join would skip it.
o_notify = orders.node(notify, after=[o_ship, o_refund], join="any")
o_audit = orders.node(notify, name="audit", after=[o_ship, o_refund])


@pytest.mark.parametrize(
    ("amount", "taken", "skipped"), [(5, "ship", "refund"), (-5, "refund", "ship")]
)
async def test_a_branch_runs_the_taken_side_and_skips_the_other(
    cyclone_env: CycloneEnv, amount: int, taken: str, skipped: str
) -> None:
    run = await orders.submit(cyclone_env.client, amount)
    async with fast_worker(cyclone_env.client, workflows=[orders]):
        await run.wait(timeout=30)
    assert await run.status() is cyclone.RunState.COMPLETED
    states = {n.name: n.state for n in (await run.info()).nodes}
    assert states[f"dyn.{taken}"] == "completed"
    assert states[f"dyn.{skipped}"] == "skipped"
    assert states["dyn.notify"] == "completed"  # join="any": one parent ran
    assert states["audit"] == "skipped"  # join="all": a parent was skipped
    assert sorted(probe.calls) == sorted([taken, "notify"])


@cyclone.step("dyn.summary")
async def summary(ctx: cyclone.Context, amount: int) -> str:
    with pytest.raises(cyclone.UnknownNodeError):
        await ctx.output("dyn.refund")  # skipped: no output to give
    return str(await ctx.output("dyn.ship"))


summed = cyclone.define_result("dyn.summed", int, str)
s_check = summed.node(check)
s_ship = summed.node(ship, after=[s_check.when("ok")])
s_refund = summed.node(refund, after=[s_check.when("refund")])
summed.set_result(summed.node(summary, after=[s_ship, s_refund], join="any"))

only_refund = cyclone.define_result("dyn.only_refund", int, str)
only_refund.set_result(only_refund.node(refund, after=[only_refund.node(check).when("refund")]))


async def test_a_node_after_a_skipped_parent_sees_only_the_outputs_there_are(
    cyclone_env: CycloneEnv,
) -> None:
    run = await summed.submit(cyclone_env.client, 5)
    async with fast_worker(cyclone_env.client, workflows=[summed]):
        assert await run.result(timeout=30) == "shipped"


async def test_a_skipped_result_node_leaves_the_run_without_a_result(
    cyclone_env: CycloneEnv,
) -> None:
    run = await only_refund.submit(cyclone_env.client, 5)
    async with fast_worker(cyclone_env.client, workflows=[only_refund]):
        with pytest.raises(cyclone.NoOutputError, match=r"result node dyn\.refund skipped"):
            await run.result(timeout=30)
    assert await run.status() is cyclone.RunState.COMPLETED


def test_over_names_what_it_needs() -> None:
    wf = cyclone.define("dyn.over_checks", int)
    approval = wf.wait("approval")
    with pytest.raises(cyclone.InvalidInputError, match="cannot map over wait node 'approval'"):
        wf.map(square, over=approval, name="each")
    with pytest.raises(cyclone.InvalidInputError, match="not its name 'approval'"):
        wf.map(square, over="approval", name="each")  # type: ignore[arg-type]
    other = cyclone.define("dyn.over_other", int)
    theirs = other.node(split)
    with pytest.raises(
        cyclone.UnknownNodeError, match=r"not a node of workflow 'dyn\.over_checks'"
    ):
        wf.map(square, over=theirs, name="each")
    with pytest.raises(
        cyclone.UnknownNodeError, match=r"not a node of workflow 'dyn\.over_checks'"
    ):
        wf.node(square, after=[theirs], name="after_theirs")
