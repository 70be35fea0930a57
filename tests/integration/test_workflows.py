"""DAG workflows: definition checks, submit, advance, results, failure, retry, waits, deadlines."""

from __future__ import annotations

import asyncio
import datetime as dt
from typing import Any

import msgspec
import pytest

import cyclone
from cyclone.testing.plugin import CycloneEnv
from tests.conftest import Listener, Probe, count_rows, fast_worker

probe = Probe()


class Cart(msgspec.Struct):
    items: list[int]


@cyclone.step("wf.sum")
async def total(ctx: cyclone.Context, cart: Cart) -> int:
    probe.calls.append(ctx.node)
    return sum(cart.items)


added = Probe()


@cyclone.step("wf.add")
async def add(ctx: cyclone.Context, n: int) -> int:
    probe.calls.append(ctx.node)
    added.started.set()
    return n + 1


@cyclone.step("wf.join")
async def join(ctx: cyclone.Context, parts: list[int]) -> int:
    probe.calls.append(ctx.node)
    return sum(parts)


def deps_sum(names: list[str]) -> Any:
    return lambda _input, outputs: [outputs[n] for n in names]


# A diamond: sum -> (left, right) -> join
diamond = cyclone.define_result("diamond", Cart, int)
d_sum = diamond.node(total)
d_left = diamond.node(add, name="left", after=[d_sum], input=lambda i, o: o["wf.sum"])
d_right = diamond.node(add, name="right", after=[d_sum], input=lambda i, o: o["wf.sum"] * 10)
d_join = diamond.node(join, after=[d_left, d_right], input=deps_sum(["left", "right"]))
diamond.set_result(d_join)


@pytest.fixture(autouse=True)
def _reset_probe() -> None:
    probe.reset()
    added.reset()


async def test_diamond_runs_each_node_once_and_returns_the_result(
    cyclone_env: CycloneEnv,
) -> None:
    run = await diamond.submit(cyclone_env.client, Cart([1, 2]))
    async with fast_worker(cyclone_env.client, workflows=[diamond]):
        assert await run.result(timeout=30) == (3 + 1) + (30 + 1)
    assert sorted(probe.calls) == ["left", "right", "wf.join", "wf.sum"]
    assert probe.calls[0] == "wf.sum" and probe.calls[-1] == "wf.join"
    info = await run.info()
    assert info.state is cyclone.RunState.COMPLETED
    assert {n.name: (n.state, n.attempts) for n in info.nodes} == {
        "wf.sum": ("completed", 1),
        "left": ("completed", 1),
        "right": ("completed", 1),
        "wf.join": ("completed", 1),
    }
    assert await count_rows(cyclone_env, "cyclone_tasks") == 0


def chain(length: int) -> cyclone.ResultWorkflow[int, int]:
    wf = cyclone.define_result(f"chain{length}", int, int)
    node = wf.node(add, name="n0")
    for i in range(1, length):
        node = wf.node(add, name=f"n{i}", after=[node], input=lambda _i, o, p=f"n{i - 1}": o[p])
    wf.set_result(node)
    return wf


async def test_chain_of_fifty(cyclone_env: CycloneEnv) -> None:
    wf = chain(50)
    run = await wf.submit(cyclone_env.client, 0)
    async with fast_worker(cyclone_env.client, workflows=[wf]):
        assert await run.result(timeout=60) == 50
    assert probe.calls == [f"n{i}" for i in range(50)]


async def test_fan_out_and_in_of_a_thousand_nodes(cyclone_env: CycloneEnv) -> None:
    wf = cyclone.define_result("fan", int, int)
    root = wf.node(add, name="root")
    leaves = [
        wf.node(add, name=f"leaf{i}", after=[root], input=lambda _i, o: o["root"])
        for i in range(998)
    ]
    wf.set_result(
        wf.node(join, name="sink", after=leaves, input=deps_sum([leaf.name for leaf in leaves]))
    )
    run = await wf.submit(cyclone_env.client, 0)
    assert await count_rows(cyclone_env, "cyclone_steps") == 1000
    assert await count_rows(cyclone_env, "cyclone_edges") == 998 * 2
    async with fast_worker(cyclone_env.client, workflows=[wf], queues={"default": 50}):
        assert await run.result(timeout=120) == 998 * 2
    assert len(probe.calls) == 1000
    assert probe.calls[0] == "root" and probe.calls[-1] == "sink"


broken = {"on": True}


@cyclone.step("wf.fragile", max_attempts=2)
async def fragile(ctx: cyclone.Context, n: int) -> int:
    probe.calls.append(ctx.node)
    if broken["on"]:
        raise RuntimeError("branch broke")
    return n


@cyclone.step("wf.slowish")
async def slowish(ctx: cyclone.Context, n: int) -> int:
    probe.started.set()
    await probe.stopped.wait()
    probe.calls.append(ctx.node)
    return n


branches = cyclone.define_result("branches", int, int)
b_root = branches.node(add, name="root")
b_bad = branches.node(fragile, name="bad", after=[b_root], input=lambda i, o: o["root"])
b_after_bad = branches.node(add, name="after_bad", after=[b_bad], input=lambda i, o: o["bad"])
b_slow = branches.node(slowish, name="slow", after=[b_root], input=lambda i, o: o["root"])
b_end = branches.node(
    join, name="end", after=[b_after_bad, b_slow], input=deps_sum(["after_bad", "slow"])
)
branches.set_result(b_end)


async def test_failed_branch_fails_the_run_and_retry_all_resumes_it(
    cyclone_env: CycloneEnv,
) -> None:
    broken["on"] = True
    client = cyclone_env.client
    run = await branches.submit(client, 1)
    async with fast_worker(client, workflows=[branches]) as worker:
        await asyncio.wait_for(probe.started.wait(), 30)  # "slow" is running
        assert await run.wait(timeout=30) is cyclone.RunState.FAILED
        probe.stopped.set()  # the running sibling may finish; the run stays failed
        with pytest.raises(cyclone.RunFailedError) as raised:
            await run.result()
        assert raised.value.error["message"] == "branch broke"
        nodes = {n.name: n for n in (await run.info()).nodes}
        assert nodes["bad"].state == "failed" and nodes["bad"].attempts == 2
        assert nodes["after_bad"].state == "pending"  # downstream never started
        assert "after_bad" not in probe.calls
        await asyncio.wait_for(worker.idle(), 30)  # "slow" finished and its completion is written
        assert (await node_states(run))["slow"] == "completed"
        assert await run.status() is cyclone.RunState.FAILED
        assert "end" not in probe.calls

        broken["on"] = False  # deploy the fix
        await run.retry_all()
        assert await run.result(timeout=30) == (2 + 1) + 2  # after_bad + slow
    nodes = {n.name: n for n in (await run.info()).nodes}
    assert nodes["bad"].attempts == 1  # a fresh budget; earlier errors kept
    assert [e["message"] for e in nodes["bad"].errors] == ["branch broke", "branch broke"]
    assert probe.calls.count("slow") == 1
    with pytest.raises(cyclone.InvalidStateError, match="only a failed run"):
        await run.retry_all()


async def node_states(run: cyclone.Run) -> dict[str, str]:
    return {n.name: n.state for n in (await run.info()).nodes}


async def test_retry_one_node(cyclone_env: CycloneEnv) -> None:
    broken["on"] = True
    run = await branches.submit(cyclone_env.client, 1)
    probe.stopped.set()
    async with fast_worker(cyclone_env.client, workflows=[branches]):
        assert await run.wait(timeout=30) is cyclone.RunState.FAILED
        with pytest.raises(cyclone.InvalidStateError, match="has not failed"):
            await run.retry("root")
        with pytest.raises(cyclone.UnknownKindError):
            await run.retry("nope")
        broken["on"] = False
        await run.retry("bad")
        assert await run.result(timeout=30) == 5


gate = cyclone.define_result("gate", int, int)
g_first = gate.node(add, name="first")
g_approval = gate.wait("approval", after=[g_first])
g_last = gate.node(add, name="last", after=[g_approval], input=lambda i, o: o["approval"]["n"])
gate.set_result(g_last)


async def test_signal_after_the_wait_node_is_reached(cyclone_env: CycloneEnv) -> None:
    client = cyclone_env.client
    run = await gate.submit(client, 1)
    async with fast_worker(client, workflows=[gate]) as worker:
        await asyncio.wait_for(added.started.wait(), 30)  # "first" ran
        await asyncio.wait_for(worker.idle(), 30)  # and its completion reached the wait node
        assert (await node_states(run))["approval"] == "waiting"
        await client.signal(run.id, "approval", {"n": 41})
        assert await run.result(timeout=30) == 42
        with pytest.raises(cyclone.InvalidStateError):
            await client.signal(run.id, "approval", {"n": 1})


async def test_signal_before_the_wait_node_is_reached(cyclone_env: CycloneEnv) -> None:
    client = cyclone_env.client
    run = await gate.submit(client, 1)
    await client.signal(run.id, "approval", {"n": 9})  # stored, applied when reached
    with pytest.raises(cyclone.InvalidStateError, match="already signalled"):
        await client.signal(run.id, "approval", {"n": 1})
    with pytest.raises(cyclone.InvalidStateError, match="not a wait node"):
        await client.signal(run.id, "first", {"n": 1})
    with pytest.raises(cyclone.UnknownKindError):
        await client.signal(run.id, "nope", None)
    async with fast_worker(client, workflows=[gate]):
        assert await run.result(timeout=30) == 10
    assert await node_states(run) == {
        "first": "completed",
        "approval": "completed",
        "last": "completed",
    }


timed_gate = cyclone.define("timed_gate", int)
timed_gate.wait("approval", timeout=0.2)


async def test_wait_timeout_fails_the_node(cyclone_env: CycloneEnv) -> None:
    run = await timed_gate.submit(cyclone_env.client, 1)
    async with fast_worker(cyclone_env.client, steps=[add], workflows=[timed_gate]):
        assert await run.wait(timeout=30) is cyclone.RunState.FAILED
    info = await run.info()
    assert info.error is not None and info.error["type"] == "WaitTimeout"
    assert info.nodes[0].state == "failed"


@cyclone.step("wf.child")
async def child(ctx: cyclone.Context, n: int) -> int:
    return n


shaped = cyclone.define("wf.shaped", str)
shaped.node(child, input=lambda text, outputs: len(text))


async def test_nodes_go_only_to_workers_that_know_their_workflow(cyclone_env: CycloneEnv) -> None:
    run = await shaped.submit(cyclone_env.client, "abc")
    async with fast_worker(cyclone_env.client, steps=[child]) as worker:
        await asyncio.wait_for(worker.drain(), 30)
    assert await run.status() is cyclone.RunState.PENDING  # it could not build the input
    async with fast_worker(cyclone_env.client, workflows=[shaped]):
        assert await run.wait(timeout=30) is cyclone.RunState.COMPLETED


async def test_submit_records_only_claimable_root_queues(
    cyclone_env: CycloneEnv, listener: Listener
) -> None:
    client = cyclone_env.client
    waits_first = cyclone.define("waits_first", int)
    waits_first.node(add, after=[waits_first.wait("go")])
    async with cyclone_env.pool.acquire() as conn:
        ttx, wakeups = cyclone.track_wakeups(conn)
        async with ttx.transaction():
            await waits_first.submit_tx(client, ttx, 1)  # root is a wait node: nothing
            assert not wakeups
            await cyclone.submit_tx(client, ttx, gate, 1)
            await gate.submit_tx(client, ttx, 1, process_in=3600)  # not claimable yet
        assert list(wakeups) == ["default"]
        await client.publish_wakeups(wakeups)
    await listener.settle()
    assert listener.counts() == {"q:default": 1}


async def test_submit_tx_rolled_back_leaves_nothing(cyclone_env: CycloneEnv) -> None:
    conn = await cyclone_env.pool.acquire()
    try:
        tx = conn.transaction()
        await tx.start()
        run = await diamond.submit_tx(cyclone_env.client, conn, Cart([1]))
        await tx.rollback()
    finally:
        await cyclone_env.pool.release(conn)
    with pytest.raises(cyclone.RunNotFoundError):
        await run.status()
    assert (await cyclone_env.client.list_runs()).runs == []
    for table in ("cyclone_runs", "cyclone_steps", "cyclone_edges", "cyclone_tasks"):
        assert await count_rows(cyclone_env, table) == 0


@cyclone.step("wf.forever", queue="slow")
async def forever(ctx: cyclone.Context, n: int) -> int:
    probe.started.set()
    try:
        await asyncio.sleep(3600)
    finally:
        probe.stopped.set()
    return n


lingering = cyclone.define("lingering", int)
lingering.node(add, name="after", after=[lingering.node(forever, name="forever")])


async def test_cancel_mid_run(cyclone_env: CycloneEnv) -> None:
    run = await lingering.submit(cyclone_env.client, 1)
    async with fast_worker(cyclone_env.client, workflows=[lingering], lease=0.6):
        await asyncio.wait_for(probe.started.wait(), 30)
        assert await run.cancel()
        await asyncio.wait_for(probe.stopped.wait(), 30)  # within a heartbeat
    assert await run.status() is cyclone.RunState.CANCELLED
    assert await node_states(run) == {"forever": "cancelled", "after": "cancelled"}
    assert await count_rows(cyclone_env, "cyclone_tasks") == 0
    with pytest.raises(cyclone.RunCancelledError):
        await cyclone.ResultRun(cyclone_env.client, run.id, int).result()
    with pytest.raises(cyclone.InvalidStateError):
        await run.retry_all()


async def pass_deadline(env: CycloneEnv, run: cyclone.Run) -> None:
    """Move a run's deadline to now: tests set it far off, then pass it once the handler runs
    (a deadline a few tenths of a second away can pass before a loaded machine claims)."""
    await env.pool.execute("UPDATE cyclone_runs SET deadline = now() WHERE id = $1", run.id)


async def test_run_deadline_fails_the_run_and_stops_handlers(cyclone_env: CycloneEnv) -> None:
    deadline = dt.datetime.now(dt.UTC) + dt.timedelta(hours=1)
    run = await lingering.submit(cyclone_env.client, 1, run_deadline=deadline)
    async with fast_worker(cyclone_env.client, workflows=[lingering], lease=0.6):
        await asyncio.wait_for(probe.started.wait(), 30)
        await pass_deadline(cyclone_env, run)
        assert await run.wait(timeout=30) is cyclone.RunState.FAILED
        await asyncio.wait_for(probe.stopped.wait(), 30)
    info = await run.info()
    assert info.error is not None and info.error["type"] == "DeadlineExceeded"


async def test_job_deadline(cyclone_env: CycloneEnv) -> None:
    deadline = dt.datetime.now(dt.UTC) + dt.timedelta(hours=1)
    run = await forever.enqueue(cyclone_env.client, 1, run_deadline=deadline)
    async with fast_worker(cyclone_env.client, steps=[forever], lease=0.6):
        await asyncio.wait_for(probe.started.wait(), 30)
        await pass_deadline(cyclone_env, run)
        assert await run.wait(timeout=30) is cyclone.RunState.FAILED
        await asyncio.wait_for(probe.stopped.wait(), 30)
    assert await count_rows(cyclone_env, "cyclone_tasks") == 0


async def test_no_output_when_the_run_has_no_result_node(cyclone_env: CycloneEnv) -> None:
    plain = cyclone.define("shared-name", int)
    plain.node(add)
    typed = cyclone.define_result("shared-name", int, int)
    typed.set_result(typed.node(add))
    run, created = await plain.submit_once(cyclone_env.client, "k", 1)
    assert created
    same, created = await typed.submit_once(cyclone_env.client, "k", 1)
    assert not created and same.id == run.id
    async with fast_worker(cyclone_env.client, workflows=[plain]):
        await run.wait(timeout=30)
    with pytest.raises(cyclone.NoOutputError):
        await same.result()


@cyclone.step("wf.spawn")
async def spawn(ctx: cyclone.Context, n: int) -> int:
    await cyclone.submit_completion(ctx, ctx.client, gate, n)
    return n


async def test_submit_completion_commits_with_the_step(cyclone_env: CycloneEnv) -> None:
    job = await spawn.enqueue(cyclone_env.client, 5)
    async with fast_worker(cyclone_env.client, steps=[spawn]):
        await job.wait(timeout=30)
    page = await cyclone_env.client.list_runs(cyclone.RunQuery(name="gate"))
    assert len(page.runs) == 1


async def test_run_keeps_the_graph_it_was_submitted_with(cyclone_env: CycloneEnv) -> None:
    v1 = cyclone.define_result("versioned", int, int)
    v1.set_result(v1.node(add, name="only"))
    run = await v1.submit(cyclone_env.client, 1)
    v2 = cyclone.define_result("versioned", int, int)  # a new deploy adds a node
    v2.set_result(v2.node(add, name="extra", after=[v2.node(add, name="only")]))
    async with fast_worker(cyclone_env.client, workflows=[v2]):
        assert await run.result(timeout=30) == 2
    assert [n.name for n in (await run.info()).nodes] == ["only"]


def test_definition_errors() -> None:
    wf = cyclone.define("bad", Cart)
    first = wf.node(total)
    with pytest.raises(cyclone.InvalidInputError, match="already has a node"):
        wf.node(total)
    with pytest.raises(cyclone.UnknownKindError):
        wf.node(add, name="x", after=["missing"], input=lambda i, o: 1)
    other = cyclone.define("other", Cart)
    with pytest.raises(cyclone.UnknownKindError):
        wf.node(add, name="y", after=[other.node(total)], input=lambda i, o: 1)
    with pytest.raises(cyclone.InvalidInputError, match="pass input="):
        wf.node(add, name="z", after=[first])  # add takes int, the workflow gives a Cart
    typed = cyclone.define_result("typed", Cart, int)
    with pytest.raises(cyclone.UnknownKindError):
        typed.set_result(first)
    as_text = typed.node(cyclone.register_kind("wf.describe", Cart, str))
    with pytest.raises(cyclone.InvalidInputError, match="outputs"):
        typed.set_result(as_text)  # it outputs str, the workflow's result is int
    with pytest.raises(cyclone.InvalidInputError, match="listed twice"):
        wf.node(add, name="w", after=[first, first], input=lambda i, o: 1)


async def test_submit_checks_before_writing(cyclone_env: CycloneEnv) -> None:
    empty = cyclone.define("empty", int)
    with pytest.raises(cyclone.InvalidInputError, match="no nodes"):
        await empty.submit(cyclone_env.client, 1)
    unset = cyclone.define_result("unset", int, int)
    unset.node(add)
    with pytest.raises(cyclone.InvalidInputError, match="no result node"):
        await unset.submit(cyclone_env.client, 1)
    with pytest.raises(cyclone.InvalidInputError, match="unknown option"):
        await gate.submit(cyclone_env.client, 1, unique="k")
    with pytest.raises(cyclone.InvalidInputError):
        await gate.submit(cyclone_env.client, "not an int")
    assert await count_rows(cyclone_env, "cyclone_runs") == 0


miswired = cyclone.define("wf.miswired", int)
miswired.node(add, name="bad", input=lambda i, o: f"#{i}")


async def test_a_wrong_value_from_an_input_function_fails_its_run_at_once(
    cyclone_env: CycloneEnv,
) -> None:
    run = await miswired.submit(cyclone_env.client, 3)
    async with fast_worker(cyclone_env.client, workflows=[miswired]):
        assert await run.wait(timeout=60) is cyclone.RunState.FAILED
    [node] = (await run.info()).nodes
    assert node.attempts == 1  # not retried: every attempt would build the same value
    [error] = node.errors
    assert error["type"] == "InvalidInputError"
    assert error["message"].startswith(
        "the value node 'bad''s input= function built for step 'wf.add' must be int: got str"
    )
