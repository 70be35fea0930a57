"""Child workflows: a node that submits a run of another workflow and completes with its
result, exactly once per attempt, linked both ways, cancelled with its parent."""

from __future__ import annotations

import asyncio

import pytest

import cyclone
from cyclone.testing.plugin import CycloneEnv
from tests.conftest import Probe, count_rows, fast_worker

probe = Probe()
FAILS: dict[str, int] = {}  # input: how many attempts of kid.work fail before one succeeds
HOLDERS = 1  # how many kid.hold calls set probe.started


@pytest.fixture(autouse=True)
def _reset() -> None:
    global HOLDERS
    probe.reset()
    FAILS.clear()
    HOLDERS = 1


@cyclone.step("kid.work", max_attempts=1)
async def work(ctx: cyclone.Context, n: int) -> int:
    probe.calls.append((ctx.run_id, n))
    if FAILS.get(str(n), 0) > 0:
        FAILS[str(n)] -= 1
        raise ValueError(f"work on {n} failed")
    return n * 10


@cyclone.step("kid.hold")
async def hold(ctx: cyclone.Context, n: int) -> int:
    probe.calls.append(n)
    if len(probe.calls) >= HOLDERS:
        probe.started.set()
    await probe.stopped.wait()
    return n


@cyclone.step("kid.total")
async def total(ctx: cyclone.Context, parts: list[int]) -> int:
    return sum(parts)


child = cyclone.define_result("kid.child", int, int)
child.set_result(child.node(work))

parent = cyclone.define_result("kid.parent", int, int)
first = parent.child(child, name="first", max_attempts=1)
second = parent.child(child, name="second", input=lambda n, _: n + 1, max_attempts=2)
parent.set_result(
    parent.node(total, after=[first, second], input=lambda _, out: [out["first"], out["second"]])
)

held = cyclone.define("kid.held", int)
held.node(hold)
holding = cyclone.define("kid.holding", int)
holding.child(held, name="h", max_attempts=1)


async def test_a_child_node_completes_with_its_childs_result(cyclone_env: CycloneEnv) -> None:
    run = await parent.submit(cyclone_env.client, 4)
    async with fast_worker(cyclone_env.client, workflows=[parent]):  # serves kid.child too
        assert await run.result(timeout=30) == 40 + 50
    info = await run.info()
    nodes = {n.name: n for n in info.nodes}
    kids = await cyclone_env.pool.fetch(
        "SELECT id, parent_node, key FROM public.cyclone_runs WHERE parent_run = $1"
        " ORDER BY parent_node",
        run.id,
    )
    # Keyed by the parent run, the node and the task of the attempt that submitted it.
    assert [k["parent_node"] for k in kids] == ["first", "second"]
    assert [k["key"].rsplit(":", 1)[0] for k in kids] == [f"{run.id}:first", f"{run.id}:second"]
    assert [nodes["first"].child_run, nodes["second"].child_run] == [k["id"] for k in kids]
    kid = await cyclone.Run(cyclone_env.client, kids[0]["id"]).info()
    assert (kid.parent_run, kid.parent_node) == (run.id, "first")
    assert info.parent_run is None and nodes["kid.total"].child_run is None


async def test_the_waiting_node_holds_no_task_and_no_slot(cyclone_env: CycloneEnv) -> None:
    run = await holding.submit(cyclone_env.client, 1)
    async with fast_worker(cyclone_env.client, workflows=[holding], queues={"default": 1}):
        await asyncio.wait_for(probe.started.wait(), 30)
        # The child's node runs in the worker's one slot: the parent's node gave it up.
        states = {n.name: n.state for n in (await run.info()).nodes}
        assert states == {"h": "waiting"}
        assert await count_rows(cyclone_env, "cyclone_tasks", f"run_id = '{run.id}'") == 0
        probe.stopped.set()
        assert await run.wait(timeout=30) is cyclone.RunState.COMPLETED


async def test_a_failed_child_is_a_failed_attempt_and_a_new_child_is_submitted(
    cyclone_env: CycloneEnv,
) -> None:
    FAILS["5"] = 1  # the first child of "second" (input 4 + 1) fails once
    run = await parent.submit(cyclone_env.client, 4)
    async with fast_worker(cyclone_env.client, workflows=[parent]):
        assert await run.result(timeout=30) == 40 + 50
    kids = await cyclone_env.pool.fetch(
        "SELECT key, state FROM public.cyclone_runs WHERE parent_node = 'second' ORDER BY id"
    )
    assert [k["state"] for k in kids] == ["failed", "completed"]
    assert len({k["key"] for k in kids}) == 2  # a new attempt's task: a new key
    node = {n.name: n for n in (await run.info()).nodes}["second"]
    [error] = node.errors
    assert error["type"] == "ChildRunFailed" and "work on 5 failed" in error["message"]


async def test_a_child_out_of_attempts_fails_the_parent_and_a_retry_submits_anew(
    cyclone_env: CycloneEnv,
) -> None:
    FAILS["4"] = 1  # "first" has one attempt: its child fails, and so does the run
    run = await parent.submit(cyclone_env.client, 4)
    async with fast_worker(cyclone_env.client, workflows=[parent]):
        with pytest.raises(cyclone.RunFailedError, match="ChildRunFailed"):
            await run.result(timeout=30)
        await run.retry_all()
        assert await run.result(timeout=30) == 90
    kids = await cyclone_env.pool.fetch(
        "SELECT key, state FROM public.cyclone_runs WHERE parent_node = 'first' ORDER BY id"
    )
    assert [k["state"] for k in kids] == ["failed", "completed"]
    assert len({k["key"] for k in kids}) == 2


async def test_cancelling_the_parent_cancels_its_child(cyclone_env: CycloneEnv) -> None:
    run = await holding.submit(cyclone_env.client, 1)
    async with fast_worker(cyclone_env.client, workflows=[holding]):
        await asyncio.wait_for(probe.started.wait(), 30)
        [kid] = await cyclone_env.pool.fetch(
            "SELECT id FROM public.cyclone_runs WHERE parent_run = $1", run.id
        )
        assert await run.cancel()
        kid_run = cyclone.Run(cyclone_env.client, kid["id"])
        assert await kid_run.wait(timeout=30) is cyclone.RunState.CANCELLED
    assert await run.status() is cyclone.RunState.CANCELLED


async def test_cancelling_a_child_fails_its_parent_node(cyclone_env: CycloneEnv) -> None:
    run = await holding.submit(cyclone_env.client, 1)
    async with fast_worker(cyclone_env.client, workflows=[holding]):
        await asyncio.wait_for(probe.started.wait(), 30)
        kid = (await run.info()).nodes[0].child_run
        assert kid is not None
        assert await cyclone.Run(cyclone_env.client, kid).cancel()
        assert await run.wait(timeout=30) is cyclone.RunState.FAILED
    info = await run.info()
    assert info.error is not None and info.error["type"] == "ChildRunCancelled"


def test_a_child_is_checked_when_defined() -> None:
    wf = cyclone.define("kid.bad", str)
    with pytest.raises(cyclone.InvalidInputError, match="takes int, not the workflow input str"):
        wf.child(child)
    with pytest.raises(cyclone.InvalidInputError, match="cannot be a child of itself"):
        wf.child(wf, input=lambda s, _: s)
    empty = cyclone.define("kid.empty", int)
    with pytest.raises(cyclone.InvalidInputError, match="has no step nodes yet"):
        wf.child(empty, input=lambda s, _: 1)


async def test_a_child_key_taken_already_links_the_run_it_names(cyclone_env: CycloneEnv) -> None:
    """As a repeated write of the same attempt would find: the child of that key is linked,
    and no second one is written."""
    run = await parent.submit(cyclone_env.client, 4)
    task = await cyclone_env.pool.fetchval(
        "SELECT id FROM public.cyclone_tasks WHERE run_id = $1 AND node = 'first'", run.id
    )
    taken, _ = await child.submit_once(cyclone_env.client, f"{run.id}:first:{task}", 4)
    async with fast_worker(cyclone_env.client, workflows=[parent]):
        assert await run.result(timeout=30) == 90
    node = {n.name: n for n in (await run.info()).nodes}["first"]
    assert node.child_run == taken.id
    assert (await taken.info()).parent_node == "first"
    assert await count_rows(cyclone_env, "cyclone_runs", "parent_node = 'first'") == 1


each = cyclone.define_result("kid.each", list[int], list[int])
each.set_result(each.map(child, max_parallel=2))
settling = cyclone.define_result("kid.settling", list[int], list[cyclone.Settled[int]])
settling.set_result(settling.map(child, settle=True))
held_each = cyclone.define_result("kid.held_each", list[int], list[int])
held_result = cyclone.define_result("kid.held_result", int, int)
held_result.set_result(held_result.node(hold))
held_each.set_result(held_each.map(held_result))


async def test_a_map_over_a_workflow_runs_a_child_per_item(cyclone_env: CycloneEnv) -> None:
    run = await each.submit(cyclone_env.client, [1, 2, 3, 4, 5])
    async with fast_worker(cyclone_env.client, workflows=[each]):
        assert await run.result(timeout=30) == [10, 20, 30, 40, 50]
    items = {n.name: n for n in (await run.info()).nodes if n.map_of == "kid.child"}
    kids = await cyclone_env.pool.fetch(
        "SELECT id, parent_node, input FROM public.cyclone_runs WHERE parent_run = $1"
        " ORDER BY parent_node",
        run.id,
    )
    # One child per item, its input the item, linked both ways.
    assert [(k["parent_node"], k["input"]) for k in kids] == [
        (f"kid.child[{i}]", str(i + 1)) for i in range(5)
    ]
    assert {k["id"] for k in kids} == {n.child_run for n in items.values()}
    assert probe.calls and len(probe.calls) == 5


async def test_a_failed_item_child_is_retried_with_a_new_child(cyclone_env: CycloneEnv) -> None:
    FAILS["2"] = 1
    run = await each.submit(cyclone_env.client, [1, 2, 3])
    async with fast_worker(cyclone_env.client, workflows=[each]):
        assert await run.result(timeout=30) == [10, 20, 30]
    kids = await cyclone_env.pool.fetch(
        "SELECT state FROM public.cyclone_runs WHERE parent_run = $1"
        " AND parent_node = 'kid.child[1]' ORDER BY id",
        run.id,
    )
    assert [k["state"] for k in kids] == ["failed", "completed"]


async def test_an_item_out_of_attempts_fails_the_run_or_settles(cyclone_env: CycloneEnv) -> None:
    FAILS["2"] = 100  # every child of item 1 fails: the item's 10 attempts run out
    failing = await each.submit(cyclone_env.client, [1, 2, 3])
    settled = await settling.submit(cyclone_env.client, [1, 2, 3])
    async with fast_worker(cyclone_env.client, workflows=[each, settling]):
        with pytest.raises(cyclone.RunFailedError, match="ChildRunFailed"):
            await failing.result(timeout=60)
        [one, two, three] = await settled.result(timeout=60)
    assert (one.value, three.value) == (10, 30) and one.ok and three.ok
    assert not two.ok and two.error is not None and two.error["type"] == "ChildRunFailed"
    assert await count_rows(cyclone_env, "cyclone_runs", f"parent_run = '{settled.id}'") == 12


async def test_cancelling_a_map_cancels_its_item_children(cyclone_env: CycloneEnv) -> None:
    global HOLDERS
    HOLDERS = 2  # both items' children are running when the run is cancelled
    run = await held_each.submit(cyclone_env.client, [1, 2])
    async with fast_worker(cyclone_env.client, workflows=[held_each]):
        await asyncio.wait_for(probe.started.wait(), 30)
        assert await run.cancel()
        kids = await cyclone_env.pool.fetch(
            "SELECT id FROM public.cyclone_runs WHERE parent_run = $1", run.id
        )
        assert len(kids) == 2
        for kid in kids:
            state = await cyclone.Run(cyclone_env.client, kid["id"]).wait(timeout=30)
            assert state is cyclone.RunState.CANCELLED


def test_a_map_over_a_workflow_is_checked_when_defined() -> None:
    wf = cyclone.define("kid.bad_map", list[str])
    with pytest.raises(cyclone.InvalidInputError, match="must be a list of int"):
        wf.map(child)
    with pytest.raises(cyclone.InvalidInputError, match="define it with cyclone"):
        wf.map(held)
    with pytest.raises(cyclone.InvalidInputError, match="takes a step, a kind or a workflow"):
        wf.map(object())  # type: ignore[call-overload]
