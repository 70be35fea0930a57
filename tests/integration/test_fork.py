"""Forking a run: the nodes before the fork node are copied with their outputs (no handler
runs), the fork node and what comes after it run again; a keyed fork forks once; a fork is
refused for a pending run, a job, an unknown node, a workflow this process does not define and
a run whose stored graph is not the definition's, before anything is written."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any, Literal

import pytest

import cyclone
from cyclone._services import transitions
from cyclone.testing.plugin import CycloneEnv
from tests.conftest import Probe, count_rows, fast_worker, waiting_on_a_lock

probe = Probe()
broken: set[str] = set()  # the steps that fail, until the test "deploys the fix"


def called(name: str) -> None:
    probe.calls.append(name)
    if name in broken:
        raise RuntimeError(f"{name} is broken")


@cyclone.step("fork.reserve", max_attempts=1)
async def reserve(ctx: cyclone.Context, cents: int) -> str:
    called("reserve")
    return f"bin-{cents}"


@cyclone.step("fork.charge", max_attempts=1)
async def charge(ctx: cyclone.Context, cents: int) -> int:
    called("charge")
    return cents


@cyclone.step("fork.ship", max_attempts=1)
async def ship(ctx: cyclone.Context, cents: int) -> str:
    called("ship")
    return f"{await ctx.output('fork.reserve')} charged {await ctx.output('fork.charge')}"


# reserve -> charge -> ship, and ship reads reserve's output too
checkout = cyclone.define_result("fork.checkout", int, str)
reserved = checkout.node(reserve)
charged = checkout.node(charge, after=[reserved])
checkout.set_result(checkout.node(ship, after=[charged, reserved]))


def fresh() -> None:
    probe.reset()
    broken.clear()


async def failed_at_charge(env: CycloneEnv, cents: int = 5) -> cyclone.ResultRun[str]:
    broken.add("charge")
    run = await checkout.submit(env.client, cents)
    async with fast_worker(env.client, workflows=[checkout]):
        assert await run.wait(timeout=30) is cyclone.RunState.FAILED
    broken.clear()
    probe.calls.clear()
    return run


async def test_a_fork_reruns_its_node_and_after_and_copies_the_rest(
    cyclone_env: CycloneEnv,
) -> None:
    fresh()
    client = cyclone_env.client
    run = await failed_at_charge(cyclone_env)
    fork = await client.fork(run, from_node="fork.charge")
    assert isinstance(fork, cyclone.ResultRun) and fork.created and fork.id != run.id
    async with fast_worker(client, workflows=[checkout]):
        assert await fork.result(timeout=30) == "bin-5 charged 5"
    assert sorted(probe.calls) == ["charge", "ship"]  # reserve was copied, not run
    info = await fork.info()
    assert info.forked_from == (run.id, "fork.charge")
    assert {n.name: (n.state, n.attempts) for n in info.nodes} == {
        "fork.reserve": ("completed", 1),
        "fork.charge": ("completed", 1),
        "fork.ship": ("completed", 1),
    }
    assert info.edges == (await run.info()).edges
    source = await run.info()
    assert source.forks == [(fork.id, "fork.charge")] and source.forked_from is None
    assert source.state is cyclone.RunState.FAILED  # the source is left as it was


async def test_a_fork_with_a_new_input_and_of_a_completed_run(cyclone_env: CycloneEnv) -> None:
    fresh()
    client = cyclone_env.client
    run = await checkout.submit(client, 3)
    async with fast_worker(client, workflows=[checkout]):
        assert await run.result(timeout=30) == "bin-3 charged 3"
        probe.calls.clear()
        fork = await client.fork(run.id, from_node="fork.charge", input=40)
        assert await fork.wait(timeout=30) is cyclone.RunState.COMPLETED
    assert (await fork.info()).input == 40
    assert await cyclone.ResultRun(client, fork.id, str).result() == "bin-3 charged 40"
    assert sorted(probe.calls) == ["charge", "ship"]


async def test_bad_forks_are_refused_before_anything_is_written(
    cyclone_env: CycloneEnv,
) -> None:
    fresh()
    client = cyclone_env.client
    pending = await checkout.submit(client, 1)
    with pytest.raises(cyclone.InvalidStateError, match="still running"):
        await client.fork(pending, from_node="fork.charge")
    run = await failed_at_charge(cyclone_env)
    before = await count_rows(cyclone_env, "cyclone_runs")
    with pytest.raises(cyclone.UnknownNodeError, match=r"no node 'fork\.nope'"):
        await client.fork(run, from_node="fork.nope")
    with pytest.raises(cyclone.InvalidInputError, match=r"input of workflow 'fork\.checkout'"):
        await client.fork(run, from_node="fork.charge", input="not an int")
    with pytest.raises(cyclone.InvalidInputError, match=r"takes a cyclone\.Run or a uuid\.UUID"):
        await client.fork(str(run.id), from_node="fork.charge")  # type: ignore[arg-type]
    with pytest.raises(cyclone.RunNotFoundError):
        await client.fork(uuid.uuid4(), from_node="fork.charge")
    job = await reserve.enqueue(client, 1)
    with pytest.raises(cyclone.InvalidStateError, match="is a job"):
        await client.fork(job, from_node="fork.reserve")
    # A run whose stored graph is not the definition's (an edge gone since it was submitted).
    await cyclone_env.pool.execute(
        "DELETE FROM cyclone_edges WHERE run_id = $1 AND parent = 'fork.reserve' "
        "AND child = 'fork.ship'",
        run.id,
    )
    with pytest.raises(cyclone.InvalidStateError, match=r"different graph .*its edges differ"):
        await client.fork(run, from_node="fork.charge")
    # A workflow this process does not define.
    await cyclone_env.pool.execute(
        "UPDATE cyclone_runs SET name = 'fork.gone' WHERE id = $1", run.id
    )
    with pytest.raises(cyclone.UnknownKindError, match=r"'fork\.gone' .* not defined"):
        await client.fork(run, from_node="fork.charge")
    assert await count_rows(cyclone_env, "cyclone_runs") == before + 1  # the job alone


async def test_a_keyed_fork_forks_once(cyclone_env: CycloneEnv) -> None:
    fresh()
    client = cyclone_env.client
    run = await failed_at_charge(cyclone_env)
    first, again = await asyncio.gather(
        client.fork(run, from_node="fork.charge", key="fix-1"),
        client.fork(run, from_node="fork.charge", key="fix-1"),
    )
    assert first.id == again.id and sorted([first.created, again.created]) == [False, True]
    retried = await client.fork(run, from_node="fork.charge", key="fix-1")
    assert retried.id == first.id and not retried.created
    with pytest.raises(cyclone.SubmitConflictError, match="different origin") as conflict:
        await client.fork(run, from_node="fork.reserve", key="fix-1")
    assert conflict.value.run_id == first.id
    with pytest.raises(cyclone.SubmitConflictError, match="different input"):
        await client.fork(run, from_node="fork.charge", input=6, key="fix-1")
    await checkout.submit_once(client, "taken", 5)  # a key of the same name, not a fork
    with pytest.raises(cyclone.SubmitConflictError, match="different origin"):
        await client.fork(run, from_node="fork.charge", key="taken")
    assert (await run.info()).forks == [(first.id, "fork.charge")]


@cyclone.step("fork.after_approval", max_attempts=1)
async def after_approval(ctx: cyclone.Context, cents: int) -> Any:
    called("after_approval")
    return await ctx.output("approval")


approving = cyclone.define("fork.approving", int)
approval = approving.wait("approval", after=[approving.node(reserve)])
approving.node(after_approval, after=[approval])


async def test_a_signalled_wait_node_is_copied_and_one_forked_from_waits_again(
    cyclone_env: CycloneEnv,
) -> None:
    fresh()
    client = cyclone_env.client
    broken.add("after_approval")
    run = await approving.submit(client, 2)
    await client.signal(run.id, "approval", {"by": "ada"})
    async with fast_worker(client, workflows=[approving]):
        assert await run.wait(timeout=30) is cyclone.RunState.FAILED
        broken.clear()
        probe.calls.clear()
        fork = await client.fork(run, from_node="fork.after_approval")
        assert await fork.wait(timeout=30) is cyclone.RunState.COMPLETED
        assert probe.calls == ["after_approval"]
        payloads = await fork.payloads()
        assert payloads.nodes["approval"].signal == {"by": "ada"}
        assert payloads.nodes["fork.after_approval"].output == {"by": "ada"}
        # Forked from the wait node itself: it waits for a signal of its own.
        again = await client.fork(fork, from_node="approval")
        states = {n.name: n.state for n in (await again.info()).nodes}
        assert states == {
            "fork.reserve": "completed",
            "approval": "waiting",
            "fork.after_approval": "pending",
        }
        await client.signal(again.id, "approval", {"by": "bob"})
        assert await again.wait(timeout=30) is cyclone.RunState.COMPLETED
    assert (await again.payloads()).nodes["fork.after_approval"].output == {"by": "bob"}


@cyclone.step("fork.days", max_attempts=1)
async def days(ctx: cyclone.Context, n: int) -> list[int]:
    called("days")
    return list(range(1, n + 1))


@cyclone.step("fork.score", max_attempts=1)
async def score(ctx: cyclone.Context, day: int) -> int:
    called("score")
    return day * 10


@cyclone.step("fork.total", max_attempts=1)
async def total(ctx: cyclone.Context, scores: list[int]) -> int:
    called("total")
    return sum(scores)


mapped = cyclone.define_result("fork.mapped", int, int)
scored = mapped.map(score, over=mapped.node(days), max_parallel=2)
mapped.set_result(mapped.node(total, after=[scored], input=lambda _, out: out["fork.score"]))


async def test_a_map_upstream_is_copied_with_its_items(cyclone_env: CycloneEnv) -> None:
    fresh()
    client = cyclone_env.client
    broken.add("total")
    run = await mapped.submit(client, 3)
    async with fast_worker(client, workflows=[mapped]):
        assert await run.wait(timeout=30) is cyclone.RunState.FAILED
        broken.clear()
        probe.calls.clear()
        fork = await client.fork(run, from_node="fork.total")
        assert await cyclone.ResultRun(client, fork.id, int).result(timeout=30) == 60
        assert probe.calls == ["total"]  # neither days nor an item ran again
        items = [n for n in (await fork.info()).nodes if n.map_of == "fork.score"]
        assert [(n.item, n.state) for n in items] == [
            (0, "completed"),
            (1, "completed"),
            (2, "completed"),
        ]
        # Forked from the map node: its items run again, over the copied list.
        probe.calls.clear()
        again = await client.fork(run, from_node="fork.score")
        assert await cyclone.ResultRun(client, again.id, int).result(timeout=30) == 60
    assert sorted(probe.calls) == ["score", "score", "score", "total"]


@cyclone.step("fork.check", max_attempts=1)
async def check(ctx: cyclone.Context, cents: int) -> Literal["ok", "refund"]:
    called("check")
    return "refund" if cents < 0 else "ok"


@cyclone.step("fork.refund", max_attempts=1)
async def refund(ctx: cyclone.Context, cents: int) -> str:
    called("refund")
    return "refunded"


@cyclone.step("fork.restock", max_attempts=1)
async def restock(ctx: cyclone.Context, cents: int) -> str:
    called("restock")
    return "restocked"


@cyclone.step("fork.close", max_attempts=1)
async def close(ctx: cyclone.Context, cents: int) -> str:
    called("close")
    return "closed"


returns = cyclone.define("fork.returns", int)
checked = returns.node(check)
refunded = returns.node(refund, after=[checked.when("refund")])
restocked = returns.node(restock, after=[checked.when("ok")])
returns.node(close, after=[refunded, restocked], join="any")


async def test_a_skipped_node_before_the_fork_node_stays_skipped(cyclone_env: CycloneEnv) -> None:
    fresh()
    client = cyclone_env.client
    broken.add("close")
    run = await returns.submit(client, -5)
    async with fast_worker(client, workflows=[returns]):
        assert await run.wait(timeout=30) is cyclone.RunState.FAILED
        broken.clear()
        probe.calls.clear()
        fork = await client.fork(run, from_node="fork.close")
        assert await fork.wait(timeout=30) is cyclone.RunState.COMPLETED
        assert probe.calls == ["close"]
        states = {n.name: n.state for n in (await fork.info()).nodes}
        assert states["fork.restock"] == "skipped" and states["fork.refund"] == "completed"
        # Forked from the branch node with an input that takes the other branch.
        probe.calls.clear()
        other = await client.fork(run, from_node="fork.check", input=5)
        assert await other.wait(timeout=30) is cyclone.RunState.COMPLETED
    assert sorted(probe.calls) == ["check", "close", "restock"]
    states = {n.name: n.state for n in (await other.info()).nodes}
    assert states["fork.refund"] == "skipped" and states["fork.restock"] == "completed"


async def test_a_fork_waits_for_a_retry_of_its_run_and_sees_it(cyclone_env: CycloneEnv) -> None:
    """The fork locks the run it forks: a retry that re-opened the run in a transaction not
    yet committed holds it back, and once that commits the fork sees a pending run."""
    fresh()
    client = cyclone_env.client
    run = await failed_at_charge(cyclone_env)
    async with cyclone_env.pool.acquire() as conn, conn.transaction():
        await transitions.retry(conn, client._queries, run.id, None)  # locks and re-opens it
        fork = asyncio.create_task(client.fork(run, from_node="fork.charge"))
        await waiting_on_a_lock(cyclone_env)
    with pytest.raises(cyclone.InvalidStateError, match="still running"):
        await fork
    assert (await run.info()).forks == []


@cyclone.step("fork.welcome", max_attempts=1)
async def welcome(ctx: cyclone.Context, n: int) -> str:
    called("welcome")
    return f"welcomed {n}"


@cyclone.step("fork.notify", max_attempts=1)
async def notify(ctx: cyclone.Context, n: int) -> str:
    called("notify")
    return str(await ctx.output("fork.welcoming"))


welcoming = cyclone.define_result("fork.welcoming", int, str)
welcoming.set_result(welcoming.node(welcome))
onboarding = cyclone.define("fork.onboarding", int)
onboarding.node(notify, after=[onboarding.child(welcoming)])


async def test_a_child_node_is_copied_with_its_child_run_or_submits_a_new_one(
    cyclone_env: CycloneEnv,
) -> None:
    fresh()
    client = cyclone_env.client
    broken.add("notify")
    run = await onboarding.submit(client, 3)
    async with fast_worker(client, workflows=[onboarding]):
        assert await run.wait(timeout=30) is cyclone.RunState.FAILED
        broken.clear()
        probe.calls.clear()
        fork = await client.fork(run, from_node="fork.notify")
        assert await fork.wait(timeout=30) is cyclone.RunState.COMPLETED
        assert probe.calls == ["notify"]  # no new child run
        child = {n.name: n.child_run for n in (await run.info()).nodes}["fork.welcoming"]
        copied = {n.name: n.child_run for n in (await fork.info()).nodes}["fork.welcoming"]
        assert copied == child is not None
        assert (await fork.payloads()).nodes["fork.notify"].output == "welcomed 3"
        again = await client.fork(run, from_node="fork.welcoming")
        assert await again.wait(timeout=30) is cyclone.RunState.COMPLETED
    assert sorted(probe.calls) == ["notify", "notify", "welcome"]
    rerun = {n.name: n.child_run for n in (await again.info()).nodes}["fork.welcoming"]
    assert rerun not in (None, child)
    assert await count_rows(cyclone_env, "cyclone_runs", "name = 'fork.welcoming'") == 2
