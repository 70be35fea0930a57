"""Typed wait nodes: a declared payload type checked when the signal is sent, nodes that wait
for any or all of several events, and timeouts that complete a node instead of failing it."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from typing import Any

import msgspec
import psycopg_pool
import pytest

import cyclone
import cyclone.sync
from cyclone.testing.plugin import CycloneEnv
from tests.cli.process import cli, one_line_error
from tests.conftest import fast_worker


class Approval(msgspec.Struct):
    by: str


class Rejection(msgspec.Struct):
    reason: str


class Documents(msgspec.Struct):
    passport: str
    address: str


seen: list[object] = []


@cyclone.step("ev.note")
async def note(ctx: cyclone.Context, value: str) -> str:
    return value


def outcome(name: str) -> Callable[[int, Mapping[str, Any]], str]:
    """An input function that records the decoded output of the node it follows."""

    def build(_input: int, outputs: Mapping[str, Any]) -> str:
        [value] = outputs.values()
        seen.append(value)
        return name

    return build


@pytest.fixture(autouse=True)
def _reset() -> None:
    seen.clear()


async def signal_column(env: CycloneEnv, run: cyclone.Run, node: str) -> object:
    return await env.pool.fetchval(
        "SELECT signal::text FROM cyclone_steps WHERE run_id = $1 AND node = $2", run.id, node
    )


async def sessions_waiting_on_a_lock(env: CycloneEnv, count: int) -> None:
    """Until ``count`` sessions of this database wait on a lock (observed, not slept on)."""
    query = (
        "SELECT count(*) FROM pg_stat_activity"
        " WHERE datname = current_database() AND wait_event_type = 'Lock'"
    )
    async with asyncio.timeout(30):
        while await env.pool.fetchval(query) < count:  # noqa: ASYNC110 - other sessions' state
            await asyncio.sleep(0.01)


async def states(run: cyclone.Run) -> dict[str, str]:
    return {n.name: n.state for n in (await run.info()).nodes}


typed = cyclone.define("ev.typed", int)
t_approval = typed.wait("approval", payload=Approval)
typed.node(note, name="after", after=[t_approval], input=outcome("after"))


async def test_a_typed_signal_is_checked_and_a_refused_one_writes_nothing(
    cyclone_env: CycloneEnv,
) -> None:
    client = cyclone_env.client
    run = await typed.submit(client, 1)
    before = await run.info()
    refused: list[object] = [{"by": "ops"}, Rejection("no"), msgspec.Raw(b'{"who": "ops"}')]
    for payload in refused:
        with pytest.raises(cyclone.InvalidInputError, match="signal payload must be"):
            await client.signal(run.id, "approval", payload)
    with pytest.raises(cyclone.InvalidInputError, match="leave event= out"):
        await client.signal(run.id, "approval", Approval("ops"), event="approved")
    assert await signal_column(cyclone_env, run, "approval") is None
    after = await run.info()
    assert (after.state, after.nodes) == (before.state, before.nodes)  # nothing was written
    await client.signal(run.id, "approval", msgspec.Raw(b'{"by": "ops"}'))  # the CLI's form
    async with fast_worker(client, steps=[note], workflows=[typed]):
        assert await run.wait(timeout=60) is cyclone.RunState.COMPLETED
    assert seen == [Approval("ops")]  # decoded as the declared type


decision = cyclone.define("ev.decision", int)
d_prepare = decision.node(note, name="prepare", input=lambda i, o: "prepared")
d_choice = decision.wait_any(
    "choice", events={"approved": Approval, "rejected": Rejection}, after=[d_prepare]
)
decision.node(note, name="ship", after=[d_choice.when("approved")], input=outcome("ship"))
decision.node(note, name="refund", after=[d_choice.when("rejected")], input=outcome("refund"))


async def test_any_of_two_racing_events_takes_exactly_one(cyclone_env: CycloneEnv) -> None:
    client = cyclone_env.client
    run = await decision.submit(client, 1)
    # Hold the run's lock so that both signals, on two connections, queue behind it.
    async with cyclone_env.pool.acquire() as holder, holder.transaction():
        await holder.execute("SELECT 1 FROM cyclone_runs WHERE id = $1 FOR UPDATE", run.id)
        approve = client.signal(run.id, "choice", Approval("ops"), event="approved")
        reject = client.signal(run.id, "choice", Rejection("late"), event="rejected")
        racing = [asyncio.create_task(approve), asyncio.create_task(reject)]
        await sessions_waiting_on_a_lock(cyclone_env, 2)
    results = await asyncio.gather(*racing, return_exceptions=True)
    [refused] = [r for r in results if isinstance(r, BaseException)]
    assert isinstance(refused, cyclone.InvalidStateError)
    assert "already took event" in str(refused)
    won = "approved" if results[0] is None else "rejected"
    async with fast_worker(client, steps=[note], workflows=[decision]):
        assert await run.wait(timeout=60) is cyclone.RunState.COMPLETED
    [event] = seen
    assert isinstance(event, cyclone.Event) and event.name == won
    assert isinstance(event.payload, Approval if won == "approved" else Rejection)
    taken, skipped = ("ship", "refund") if won == "approved" else ("refund", "ship")
    nodes = await states(run)
    assert (nodes[taken], nodes[skipped], nodes["choice"]) == ("completed", "skipped", "completed")


async def test_events_are_checked_by_name_and_type(cyclone_env: CycloneEnv) -> None:
    client = cyclone_env.client
    run = await decision.submit(client, 1)
    with pytest.raises(cyclone.InvalidInputError, match="and no event is not one"):
        await client.signal(run.id, "choice", Approval("ops"))
    with pytest.raises(cyclone.InvalidInputError, match="event 'maybe' is not one"):
        await client.signal(run.id, "choice", Approval("ops"), event="maybe")
    with pytest.raises(cyclone.InvalidInputError, match=r"must be tests\.integration"):
        await client.signal(run.id, "choice", Approval("ops"), event="rejected")
    assert await signal_column(cyclone_env, run, "choice") is None
    # A process that did not define the workflow (the CLI here) stores the payload
    # unchecked, but the database still refuses an event the node does not declare.
    code, _, err = await cli(
        "runs", "signal", str(run.id), "choice", "--event", "maybe", dsn=cyclone_env.dsn
    )
    assert "waits for events 'approved', 'rejected', not event 'maybe'" in one_line_error(code, err)
    code, out, err = await cli(
        "runs", "signal", str(run.id), "choice", "--event", "rejected",
        "--payload", '{"reason": "stock"}', dsn=cyclone_env.dsn,
    )  # fmt: skip
    assert code == 0, err
    assert out.strip() == f"signalled rejected of choice of run {run.id}"
    async with fast_worker(client, steps=[note], workflows=[decision]):
        assert await run.wait(timeout=60) is cyclone.RunState.COMPLETED
    assert seen == [cyclone_event("rejected", Rejection("stock"))]


def cyclone_event(name: str, payload: object) -> object:
    """The value an any-of node's output decodes to, for comparison."""
    return msgspec.json.decode(
        msgspec.json.encode({"name": name, "payload": payload}), type=d_choice.output_type
    )


papers = cyclone.define("ev.papers", int)
p_prepare = papers.node(note, name="prepare", input=lambda i, o: "prepared")
p_docs = papers.wait_all("docs", events=Documents, after=[p_prepare])
papers.node(note, name="file", after=[p_docs], input=outcome("file"))


async def test_all_of_completes_once_every_event_came_early_or_not(
    cyclone_env: CycloneEnv,
) -> None:
    client = cyclone_env.client
    run = await papers.submit(client, 1)
    # Before the node is reachable ("prepare" has not run): kept, as early signals are.
    await client.signal(run.id, "docs", "P-1", event="passport")
    with pytest.raises(cyclone.InvalidStateError, match="event 'passport' of wait node"):
        await client.signal(run.id, "docs", "P-2", event="passport")
    async with fast_worker(client, steps=[note], workflows=[papers]):
        async with asyncio.timeout(60):
            while (await states(run))["docs"] != "waiting":  # noqa: ASYNC110
                await asyncio.sleep(0.02)
        assert (await states(run))["docs"] == "waiting"  # one of two events: it waits on
        await client.signal(run.id, "docs", "1 Main St", event="address")
        assert await run.wait(timeout=60) is cyclone.RunState.COMPLETED
    assert seen == [Documents(passport="P-1", address="1 Main St")]


escalation = cyclone.define("ev.escalation", int)
e_choice = escalation.wait_any(
    "choice", events={"approved": Approval}, timeout=0.2, on_timeout="nobody answered"
)
escalation.node(note, name="ship", after=[e_choice.when("approved")], input=outcome("ship"))
escalation.node(note, name="escalate", after=[e_choice.when("timeout")], input=outcome("esc"))
flag = cyclone.define("ev.flag", int)
f_ok = flag.wait("ok", payload=bool, timeout=0.2, on_timeout=False)
flag.node(note, name="yes", after=[f_ok.when(True)], input=outcome("yes"))
flag.node(note, name="no", after=[f_ok.when(False)], input=outcome("no"))


async def test_on_timeout_completes_the_node_and_leads_to_a_branch(
    cyclone_env: CycloneEnv,
) -> None:
    client = cyclone_env.client
    escalated, flagged = await escalation.submit(client, 1), await flag.submit(client, 1)
    async with fast_worker(client, steps=[note], workflows=[escalation, flag]):
        assert await escalated.wait(timeout=60) is cyclone.RunState.COMPLETED
        assert await flagged.wait(timeout=60) is cyclone.RunState.COMPLETED
    assert await states(escalated) == {
        "choice": "completed",
        "ship": "skipped",
        "escalate": "completed",
    }
    assert await states(flagged) == {"ok": "completed", "yes": "skipped", "no": "completed"}
    [event, value] = sorted(seen, key=lambda v: isinstance(v, bool))
    assert isinstance(event, cyclone.Event)
    assert (event.name, event.payload, value) == ("timeout", "nobody answered", False)
    with pytest.raises(cyclone.InvalidStateError, match="it takes no more signals"):
        await client.signal(escalated.id, "choice", Approval("late"), event="approved")


def test_definitions_are_checked() -> None:
    wf = cyclone.define("ev.checked", int)
    with pytest.raises(cyclone.InvalidInputError, match="on_timeout of wait node 'a'"):
        wf.wait("a", payload=bool, timeout=1, on_timeout="no")
    with pytest.raises(cyclone.InvalidInputError, match="on_timeout= but no timeout="):
        wf.wait("a", payload=bool, on_timeout=False)
    with pytest.raises(cyclone.InvalidInputError, match="'timeout' is the event a timeout"):
        wf.wait_any("b", events={"timeout": int})
    with pytest.raises(cyclone.InvalidInputError, match="events= takes a dict"):
        # A Struct names the events of wait_all only.
        wf.wait_any("c", events=Documents)  # type: ignore[arg-type]
    with pytest.raises(cyclone.InvalidInputError, match="names no event"):
        wf.wait_all("d", events={})
    with pytest.raises(cyclone.InvalidInputError, match="has no event 'timeout' to branch on"):
        wf.wait_any("f", events={"x": int}).when("timeout")  # no on_timeout: never taken
    e = wf.wait_any("e", events={"x": int})
    with pytest.raises(cyclone.InvalidInputError, match="branch value of node 'e'"):
        wf.node(note, after=[e.when(1)], input=lambda i, o: "x")  # type: ignore[arg-type]


def test_the_sync_client_checks_and_delivers_events(cyclone_env: CycloneEnv) -> None:
    with psycopg_pool.ConnectionPool(cyclone_env.dsn, min_size=1, max_size=2) as pool:
        client = cyclone.sync.Client(pool)
        run = client.submit(decision, 1)
        with pytest.raises(cyclone.InvalidInputError, match="must be"):
            client.signal(run.id, "choice", {"by": "ops"}, event="approved")
        client.signal(run.id, "choice", Rejection("stock"), event="rejected")
        with pytest.raises(cyclone.InvalidStateError, match="already took event 'rejected'"):
            client.signal(run.id, "choice", Approval("ops"), event="approved")
        with pool.connection() as conn:
            stored = conn.execute(
                "SELECT signal FROM cyclone_steps WHERE run_id = %s AND node = 'choice'",
                (run.id,),
            ).fetchone()
    assert stored is not None
    assert stored[0] == {"name": "rejected", "payload": {"reason": "stock"}}


forms = cyclone.define("ev.forms", int)
w_forms = forms.wait_all(
    "forms", events={"tax": str, "bank": str}, timeout=0.2, on_timeout={"bank": None}
)
forms.node(note, name="file", after=[w_forms], input=outcome("file"))


async def test_all_of_at_its_timeout_keeps_the_events_that_came(cyclone_env: CycloneEnv) -> None:
    client = cyclone_env.client
    run = await forms.submit(client, 1)
    await client.signal(run.id, "forms", "T-1", event="tax")
    async with fast_worker(client, steps=[note], workflows=[forms]):
        assert await run.wait(timeout=60) is cyclone.RunState.COMPLETED
    assert seen == [{"tax": "T-1", "bank": None}]


async def test_events_are_sealed_and_still_branch(cyclone_env: CycloneEnv) -> None:
    ring = cyclone.Keyring({"k": cyclone.Keyring.generate_key()}, current="k")
    async with cyclone.Client(cyclone_env.pool, cipher=ring) as client:
        chosen, filed = await decision.submit(client, 1), await papers.submit(client, 1)
        await client.signal(chosen.id, "choice", Approval("SECRET-1"), event="approved")
        await client.signal(filed.id, "docs", "SECRET-2", event="passport")
        await client.signal(filed.id, "docs", "SECRET-3", event="address")
        stored = await cyclone_env.pool.fetchval(
            "SELECT string_agg(signal::text, ' ') FROM cyclone_steps WHERE run_id = ANY($1)",
            [chosen.id, filed.id],
        )
        assert "SECRET" not in stored and '"name": "approved"' in stored
        async with fast_worker(client, steps=[note], workflows=[decision, papers]):
            assert await chosen.wait(timeout=60) is cyclone.RunState.COMPLETED
            assert await filed.wait(timeout=60) is cyclone.RunState.COMPLETED
    assert sorted(map(repr, seen)) == sorted(
        map(
            repr,
            [
                cyclone_event("approved", Approval("SECRET-1")),
                Documents(passport="SECRET-2", address="SECRET-3"),
            ],
        )
    )
    assert (await states(chosen))["ship"] == "completed"
