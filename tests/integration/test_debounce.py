"""debounce= and throttle= on enqueue: a key sends the call to the key's waiting run (pushed
back, its input replaced or merged) or to the run that opened its period, exactly, however
the calls and the claims interleave."""

from __future__ import annotations

import asyncio
import datetime as dt
import uuid
from typing import Any

import asyncpg
import psycopg_pool
import pytest

import cyclone
from cyclone._storage import queries as db
from cyclone.testing.plugin import CycloneEnv
from tests.conftest import Probe, count_rows, fast_worker

probe = Probe()


@cyclone.step("debounce.collect", queue="debounce")
async def collect(ctx: cyclone.Context, items: list[int]) -> int:
    probe.calls.append(list(items))
    return len(items)


def concat(old: list[int], new: list[int]) -> list[int]:
    return old + new


async def stored(env: CycloneEnv, run_id: uuid.UUID) -> asyncpg.Record:
    """A run's input and its task's start, claims and debounce columns."""
    row = await env.pool.fetchrow(
        "SELECT r.input::text AS input, t.available_at, t.claims, t.debounce_key,"
        " t.debounce_since, t.state FROM public.cyclone_runs r"
        " LEFT JOIN public.cyclone_tasks t ON t.run_id = r.id WHERE r.id = $1",
        run_id,
    )
    assert row is not None
    return row


async def blocked_on_a_lock(env: CycloneEnv, pid: int) -> None:
    """Until the session ``pid`` waits for a lock (it is blocked by the other transaction)."""
    for _ in range(600):
        waiting = await env.pool.fetchval(
            "SELECT wait_event_type FROM pg_stat_activity WHERE pid = $1", pid
        )
        if waiting == "Lock":
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"session {pid} never waited for a lock")


async def test_a_debounce_pushes_the_waiting_run_back_and_replaces_its_input(
    cyclone_env: CycloneEnv,
) -> None:
    client = cyclone_env.client
    first = await collect.enqueue(client, [1], debounce=cyclone.Debounce("k", 60))
    assert first.created
    before = await stored(cyclone_env, first.id)
    assert before["debounce_key"] == "k" and before["input"] == "[1]"
    second = await collect.enqueue(
        client, [2], debounce=cyclone.Debounce("k", dt.timedelta(seconds=120))
    )
    assert (second.id, second.created) == (first.id, False)
    after = await stored(cyclone_env, first.id)
    assert after["input"] == "[2]"
    assert after["available_at"] - before["available_at"] >= dt.timedelta(seconds=59)
    assert after["debounce_since"] == before["debounce_since"]
    # Another key, or the same key of another kind, is a run of its own.
    other = await collect.enqueue(client, [3], debounce=cyclone.Debounce("other", 60))
    assert other.created and other.id != first.id
    assert await count_rows(cyclone_env, "cyclone_runs") == 2
    assert (await first.payloads()).input == [2]
    assert await first.status() is cyclone.RunState.PENDING


async def test_max_wait_caps_the_push_back(cyclone_env: CycloneEnv) -> None:
    client = cyclone_env.client
    debounce = cyclone.Debounce("cap", delay=60, max_wait=90)
    run = await collect.enqueue(client, [1], debounce=debounce)
    # The run waited 80 s of its 90 already: a push may move it 10 s on, not 60.
    await cyclone_env.pool.execute(
        "UPDATE public.cyclone_tasks SET debounce_since = debounce_since - interval '80 s'"
    )
    await collect.enqueue(client, [2], debounce=debounce)
    row = await stored(cyclone_env, run.id)
    assert row["available_at"] == row["debounce_since"] + dt.timedelta(seconds=90)
    # Past its max_wait, a push leaves it claimable now, and wakes the queue at commit.
    await cyclone_env.pool.execute(
        "UPDATE public.cyclone_tasks SET debounce_since = debounce_since - interval '1 hour'"
    )
    async with cyclone_env.pool.acquire() as conn:
        ttx, wakeups = cyclone.track_wakeups(conn)
        async with ttx.transaction():
            pushed = await collect.enqueue_tx(client, ttx, [3], debounce=debounce)
        assert pushed.id == run.id and set(wakeups) == {"debounce"}
        async with ttx.transaction():  # a push that leaves it waiting wakes nobody
            await collect.enqueue_tx(client, ttx, [4], debounce=cyclone.Debounce("new", 60))
        assert set(wakeups) == {"debounce"}
    probe.reset()
    async with fast_worker(client, steps=[collect], queues={"debounce": 1}):
        assert await run.result(timeout=30) == 1
    assert probe.calls == [[3]]


async def test_a_merge_folds_every_input_into_the_waiting_run(cyclone_env: CycloneEnv) -> None:
    client = cyclone_env.client
    debounce = cyclone.Debounce("m", 60, merge=concat)
    runs = [await collect.enqueue(client, [i], debounce=debounce) for i in range(4)]
    assert {r.id for r in runs} == {runs[0].id}
    assert [r.created for r in runs] == [True, False, False, False]
    assert (await runs[0].payloads()).input == [0, 1, 2, 3]

    # The merged input is checked as any input: too large, nothing changes.
    small = cyclone.Client(cyclone_env.pool, payload_limit=16)
    with pytest.raises(cyclone.PayloadTooLargeError, match="merged input"):
        await collect.enqueue(small, [9, 9, 9, 9], debounce=debounce)
    assert (await runs[0].payloads()).input == [0, 1, 2, 3]


@pytest.mark.parametrize("merge", [None, concat], ids=["replace", "merge"])
@pytest.mark.parametrize("existing", [False, True], ids=["new-key", "waiting-run"])
async def test_two_concurrent_enqueues_of_one_key_end_with_one_waiting_run(
    cyclone_env: CycloneEnv, merge: Any, existing: bool
) -> None:
    client = cyclone_env.client
    debounce = cyclone.Debounce("race", 60, merge=merge)
    if existing:
        await collect.enqueue(client, [0], debounce=debounce)
    async with cyclone_env.pool.acquire() as a, cyclone_env.pool.acquire() as b:
        tx_a, tx_b = a.transaction(), b.transaction()
        await tx_a.start()
        await tx_b.start()
        first = await collect.enqueue_tx(client, a, [1], debounce=debounce)
        second = asyncio.ensure_future(collect.enqueue_tx(client, b, [2], debounce=debounce))
        await blocked_on_a_lock(cyclone_env, b.get_server_pid())
        assert not second.done()
        await tx_a.commit()
        later = await asyncio.wait_for(second, 30)
        await tx_b.commit()
    assert later.id == first.id and not later.created and first.created is not existing
    assert await count_rows(cyclone_env, "cyclone_runs") == 1
    expected = ([0] if existing else []) + [1, 2] if merge else [2]
    assert (await first.payloads()).input == expected


async def test_a_rolled_back_debounce_leaves_the_waiting_run_as_it_was(
    cyclone_env: CycloneEnv,
) -> None:
    client = cyclone_env.client
    run = await collect.enqueue(client, [1], debounce=cyclone.Debounce("rb", 60))
    before = await stored(cyclone_env, run.id)
    async with cyclone_env.pool.acquire() as conn:
        tx = conn.transaction()
        await tx.start()
        pushed = await collect.enqueue_tx(client, conn, [2], debounce=cyclone.Debounce("rb", 0))
        assert pushed.id == run.id and not pushed.created
        # Pushed to now, but held until the transaction ends: a claim skips it.
        async with cyclone_env.pool.acquire() as other:
            request = db.ClaimRequest("debounce", [collect.name], 10, 30.0, "w", [])
            assert await db.task_claim_plain(other, client._queries, request) == []
        await tx.rollback()
    after = await stored(cyclone_env, run.id)
    assert (after["input"], after["available_at"]) == ("[1]", before["available_at"])
    assert (after["claims"], after["state"]) == (0, "available")


async def test_a_debounce_waits_for_a_claim_and_never_edits_a_started_run(
    cyclone_env: CycloneEnv,
) -> None:
    client, q = cyclone_env.client, cyclone_env.client._queries
    debounce = cyclone.Debounce("claimed", 0)
    run = await collect.enqueue(client, [1], debounce=debounce)
    request = db.ClaimRequest("debounce", [collect.name], 10, 30.0, "w", [])
    async with cyclone_env.pool.acquire() as claimer:
        tx = claimer.transaction()
        await tx.start()
        (task,) = await db.task_claim_plain(claimer, q, request)
        assert task["run_id"] == run.id
        async with cyclone_env.pool.acquire() as enqueuer, enqueuer.transaction():
            pushing = asyncio.ensure_future(
                collect.enqueue_tx(client, enqueuer, [2], debounce=debounce)
            )
            await blocked_on_a_lock(cyclone_env, enqueuer.get_server_pid())
            await tx.commit()
            fresh = await asyncio.wait_for(pushing, 30)
    assert fresh.created and fresh.id != run.id
    started = await stored(cyclone_env, run.id)
    assert (started["input"], started["state"], started["claims"]) == ("[1]", "running", 1)
    assert (await stored(cyclone_env, fresh.id))["input"] == "[2]"


async def test_debounced_merges_racing_a_worker_lose_and_repeat_nothing(
    cyclone_env: CycloneEnv,
) -> None:
    """With no delay, each enqueue races the worker's claims: it either merges into a run not
    yet claimed, or makes a new one. Every item reaches exactly one handler call, so no merge
    went to a run that had started."""
    probe.reset()
    client = cyclone_env.client
    debounce = cyclone.Debounce("busy", 0, merge=concat)
    handles = []
    async with fast_worker(client, steps=[collect], queues={"debounce": 2}):
        for i in range(60):
            handles.append(await collect.enqueue(client, [i], debounce=debounce))
            if i % 7 == 0:
                await asyncio.sleep(0)  # let the worker claim between some of them
        for run in {h.id: h for h in handles}.values():
            assert await run.wait(timeout=60) is cyclone.RunState.COMPLETED
    seen = [item for call in probe.calls for item in call]
    assert sorted(seen) == list(range(60))
    runs = {h.id for h in handles}
    assert len(probe.calls) == len(runs) == sum(h.created for h in handles)


async def test_a_debounce_in_a_completion_transaction(cyclone_env: CycloneEnv) -> None:
    probe.reset()
    client = cyclone_env.client

    @cyclone.step("debounce.fan", queue="debounce")
    async def fan(ctx: cyclone.Context, n: int) -> list[str]:
        made = []
        for i in range(n):
            run = await cyclone.enqueue_completion(
                ctx, client, collect, [i], debounce=cyclone.Debounce("fan", 600, merge=concat)
            )
            made.append(str(run.id))
        return made

    parent = await fan.enqueue(client, 3)
    async with fast_worker(client, steps=[fan], queues={"debounce": 1}):
        made = await parent.result(timeout=30)
    assert len(set(made)) == 1
    assert (await stored(cyclone_env, uuid.UUID(made[0])))["input"] == "[0, 1, 2]"


async def test_a_throttle_drops_calls_within_its_period(cyclone_env: CycloneEnv) -> None:
    client = cyclone_env.client
    throttle = cyclone.Throttle("t", dt.timedelta(minutes=1))
    first = await collect.enqueue(client, [1], throttle=throttle)
    dropped = await collect.enqueue(client, [2], throttle=throttle)
    assert first.created and (dropped.id, dropped.created) == (first.id, False)
    assert (await first.payloads()).input == [1]
    # In any state: the run that opened the period holds it after it ran.
    probe.reset()
    async with fast_worker(client, steps=[collect], queues={"debounce": 1}):
        assert await first.result(timeout=30) == 1
    again = await collect.enqueue(client, [3], throttle=throttle)
    assert again.id == first.id and not again.created
    other = await collect.enqueue(client, [4], throttle=cyclone.Throttle("u", 60))
    assert other.created
    assert await count_rows(cyclone_env, "cyclone_runs") == 2
    # Once the period has passed, the next call makes a run, runnable at once.
    await cyclone_env.pool.execute(
        "UPDATE public.cyclone_throttles SET opened = opened - interval '61 s' WHERE key = 't'"
    )
    after = await collect.enqueue(client, [5], throttle=throttle)
    assert after.created and after.id != first.id
    row = await stored(cyclone_env, after.id)
    assert row["available_at"] <= await cyclone_env.pool.fetchval("SELECT now()")
    assert (await collect.enqueue(client, [6], throttle=throttle)).id == after.id
    # A call that opens a period wakes the queue at commit; a dropped one wakes nobody.
    async with cyclone_env.pool.acquire() as conn:
        for key, woken in (("t", set()), ("w", {"debounce"})):
            ttx, wakeups = cyclone.track_wakeups(conn)
            async with ttx.transaction():
                await collect.enqueue_tx(client, ttx, [7], throttle=cyclone.Throttle(key, 60))
            assert set(wakeups) == woken


@pytest.mark.parametrize("commit", [True, False], ids=["commit", "rollback"])
async def test_two_concurrent_throttled_enqueues_make_one_run(
    cyclone_env: CycloneEnv, commit: bool
) -> None:
    client = cyclone_env.client
    throttle = cyclone.Throttle("t", 60)
    async with cyclone_env.pool.acquire() as a, cyclone_env.pool.acquire() as b:
        tx_a = a.transaction()
        await tx_a.start()
        first = await collect.enqueue_tx(client, a, [1], throttle=throttle)
        async with b.transaction():
            second = asyncio.ensure_future(collect.enqueue_tx(client, b, [2], throttle=throttle))
            await blocked_on_a_lock(cyclone_env, b.get_server_pid())
            await (tx_a.commit() if commit else tx_a.rollback())
            later = await asyncio.wait_for(second, 30)
    assert first.created
    assert (later.id == first.id, later.created) == (commit, not commit)
    assert await count_rows(cyclone_env, "cyclone_runs") == 1


BAD: list[tuple[dict[str, Any], type[Exception], str]] = [
    ({"debounce": cyclone.Debounce("k", 1), "throttle": cyclone.Throttle("k", 1)},
     cyclone.InvalidInputError, "not both"),
    ({"debounce": cyclone.Debounce("k", 1), "unique": "u"}, cyclone.InvalidInputError, "unique"),
    ({"debounce": cyclone.Debounce("k", 1), "sequence": "s"}, cyclone.InvalidInputError,
     "sequence"),
    ({"debounce": cyclone.Debounce("k", 1), "process_in": 5}, cyclone.InvalidInputError,
     "process_in"),
    ({"throttle": cyclone.Throttle("k", 1), "unique": "u"}, cyclone.InvalidInputError, "unique"),
    ({"debounce": "k"}, cyclone.InvalidInputError, "cyclone.Debounce"),
    ({"throttle": 5}, cyclone.InvalidInputError, "cyclone.Throttle"),
]  # fmt: skip


@pytest.mark.parametrize(("options", "error", "match"), BAD)
async def test_bad_options_write_nothing(
    cyclone_env: CycloneEnv, options: dict[str, Any], error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        await collect.enqueue(cyclone_env.client, [1], **options)
    assert await count_rows(cyclone_env, "cyclone_runs") == 0


async def test_bad_gates_are_refused_when_made_and_many_inputs_write_nothing(
    cyclone_env: CycloneEnv,
) -> None:
    made: list[object] = []
    with pytest.raises(cyclone.InvalidKeyError):
        made.append(cyclone.Debounce("", 1))
    with pytest.raises(cyclone.InvalidKeyError):
        made.append(cyclone.Throttle("x" * 300, 1))
    with pytest.raises(cyclone.InvalidOptionError, match="at least its delay"):
        made.append(cyclone.Debounce("k", 10, max_wait=5))
    with pytest.raises(cyclone.InvalidOptionError, match="not negative"):
        made.append(cyclone.Debounce("k", -1))
    with pytest.raises(cyclone.InvalidOptionError, match="more than zero"):
        made.append(cyclone.Throttle("k", 0))
    with pytest.raises(cyclone.InvalidInputError, match="a function"):
        made.append(cyclone.Debounce("k", 1, merge=5))
    assert made == []

    def failing(old: list[int], new: list[int]) -> list[int]:
        raise ValueError("cannot merge")

    client = cyclone_env.client
    with pytest.raises(cyclone.InvalidInputError, match="enqueue_many"):
        await collect.enqueue_many(client, [[1], [2]], debounce=cyclone.Debounce("k", 1))
    await collect.enqueue(client, [1], debounce=cyclone.Debounce("f", 60))
    with pytest.raises(ValueError, match="cannot merge"):
        await collect.enqueue(client, [2], debounce=cyclone.Debounce("f", 60, merge=failing))
    (row,) = await cyclone_env.pool.fetch("SELECT input::text FROM public.cyclone_runs")
    assert row["input"] == "[1]"


async def test_a_key_is_found_by_its_index_among_many_plain_jobs(cyclone_env: CycloneEnv) -> None:
    client, q = cyclone_env.client, cyclone_env.client._queries
    await collect.enqueue_many(client, [[i] for i in range(3000)])
    await collect.enqueue(client, [1], debounce=cyclone.Debounce("plan", 60))
    await cyclone_env.pool.execute("ANALYZE public.cyclone_tasks")
    job = db.GatedJob(uuid.uuid4(), "[1]", collect.name, "debounce", 0, 1, None, None, None)
    params = {"debounce_key": "plan", "delay": 60.0, "max_wait": None, "push": True}
    statements = {
        "job_debounce": {**job.params(), **params},
        "job_debounce_find": {"kind": collect.name, "debounce_key": "plan"},
    }
    async with cyclone_env.pool.acquire() as conn:
        for mode in ("custom", "generic"):
            await conn.execute(f"SET plan_cache_mode = force_{mode}_plan")
            for name, values in statements.items():
                sql, args = q.bind(name, values)
                plan = await (await conn.prepare(f"EXPLAIN (FORMAT JSON) {sql}")).fetchval(*args)
                assert "idx_tasks_debounce" in plan, (name, mode)
                assert '"Seq Scan"' not in plan, (name, mode, plan)


def test_the_synchronous_client_debounces_and_throttles(cyclone_env: CycloneEnv) -> None:
    with psycopg_pool.ConnectionPool(cyclone_env.dsn, min_size=1, max_size=2) as pool:
        client = cyclone.sync.Client(pool)
        merged = cyclone.Debounce("sync", 60, merge=concat)
        first = client.enqueue(collect, [1], debounce=merged)
        second = client.enqueue(collect, [2], debounce=merged)
        assert (second.id, first.created, second.created) == (first.id, True, False)
        with pool.connection() as conn, conn.transaction():
            pushed = client.enqueue_tx(conn, collect, [3], debounce=merged)
        assert pushed.id == first.id
        throttle = cyclone.Throttle("sync", 60)
        opened = client.enqueue(collect, [4], throttle=throttle)
        dropped = client.enqueue(collect, [5], throttle=throttle)
        assert (dropped.id, opened.created, dropped.created) == (opened.id, True, False)
        with pool.connection() as conn:
            row = conn.execute("SELECT input FROM cyclone_runs WHERE id = %s", [first.id])
            assert row.fetchone() == ([1, 2, 3],)


@pytest.mark.parametrize(
    "option",
    [cyclone.Debounce("rr", 60), cyclone.Debounce("rr", 60, merge=concat)],
    ids=["debounce", "merge"],
)
async def test_a_key_changed_after_a_repeatable_read_snapshot_is_a_serialization_failure(
    cyclone_env: CycloneEnv, option: cyclone.Debounce[list[int]]
) -> None:
    client = cyclone_env.client
    for gate in ({"debounce": option}, {"throttle": cyclone.Throttle("rr", 60)}):
        async with (
            cyclone_env.pool.acquire() as conn,
            conn.transaction(isolation="repeatable_read"),
        ):
            await conn.fetchval("SELECT 1")  # the transaction's snapshot, taken now
            made = await collect.enqueue(client, [1], **gate)  # committed after it
            with pytest.raises(asyncpg.SerializationError):
                await collect.enqueue_tx(client, conn, [2], **gate)
        assert (await made.payloads()).input == [1]
