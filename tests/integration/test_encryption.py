"""Sealed payloads: what is stored, what workers and readers get back, submit_once's rule
under sealing, and rotation while workers run."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

import msgspec
import pytest

import cyclone
from cyclone.testing.plugin import CycloneEnv
from tests.conftest import count_rows, fast_worker

OLD = cyclone.Keyring.generate_key()
NEW = cyclone.Keyring.generate_key()
SECRET = "card-4242-secret"


class Card(msgspec.Struct):
    holder: str
    number: str


@cyclone.step("sealed.charge")
async def charge(ctx: cyclone.Context, card: Card) -> dict[str, str]:
    return {"charged": card.number}


@cyclone.step("sealed.refuse", max_attempts=1)
async def refuse(ctx: cyclone.Context, card: Card) -> None:
    raise RuntimeError(f"declined {card.number}")


@cyclone.step("sealed.receipt")
async def receipt(ctx: cyclone.Context, card: Card) -> str:
    charged = await ctx.output("sealed.charge")
    return f"{card.holder}: {charged['charged']}"


@cyclone.step("sealed.total")
async def total(ctx: cyclone.Context, amounts: list[int]) -> int:
    return sum(amounts)


@cyclone.step("sealed.double")
async def double(ctx: cyclone.Context, amount: int) -> int:
    return amount * 2


@cyclone.step("sealed.echo")
async def echo(ctx: cyclone.Context, value: Any) -> Any:
    return value


# A workflow with a node output read through ctx.output and an input function, a wait node
# whose signal payload becomes its output, and a map node whose items are a sealed list.
billing = cyclone.define_result("sealed.billing", Card, str)
c = billing.node(charge)
approval = billing.wait("approval", after=[c])
r = billing.node(receipt, after=[c, approval])
totals = billing.node(
    total, name="total", after=[approval], input=lambda card, outs: outs["approval"]
)
billing.set_result(r)

doubling = cyclone.define_result("sealed.doubling", list[int], list[int])
doubling.set_result(doubling.map(double))


def ring(*ids: str) -> cyclone.Keyring:
    keys = {"old": OLD, "new": NEW}
    return cyclone.Keyring({i: keys[i] for i in ids}, current=ids[0])


@contextlib.asynccontextmanager
async def client_with(
    env: CycloneEnv, keyring: cyclone.Keyring | None
) -> AsyncIterator[cyclone.Client]:
    async with cyclone.Client(env.pool, cipher=keyring) as client:
        yield client


async def raw(env: CycloneEnv, sql: str, *args: Any) -> str:
    """Every payload column a query returns, as text, for looking for plaintext."""
    rows = await env.pool.fetch(sql, *args)
    return " ".join(str(v) for row in rows for v in row.values())


async def all_payloads(env: CycloneEnv) -> str:
    return " ".join(
        [
            await raw(env, "SELECT input, output, error, errors FROM public.cyclone_runs"),
            await raw(env, "SELECT input, output, signal, errors FROM public.cyclone_steps"),
            await raw(env, "SELECT input, errors FROM public.cyclone_tasks"),
        ]
    )


async def test_a_job_round_trips_and_is_ciphertext_at_rest(cyclone_env: CycloneEnv) -> None:
    async with client_with(cyclone_env, ring("new")) as client:
        run = await charge.enqueue(client, Card("Ada", SECRET))
        many = await charge.enqueue_many(client, [Card("Bo", "b-1"), Card("Cy", "c-2")])
        stored = await all_payloads(cyclone_env)
        # Each probe holds a "-", which base64 ciphertext never does.
        assert SECRET not in stored and "b-1" not in stored
        assert '"$cyclone.sealed": "new"' in stored
        async with fast_worker(client, steps=[charge]):
            assert await run.result(timeout=30) == {"charged": SECRET}
            assert [await m.result(timeout=30) for m in many] == [
                {"charged": "b-1"},
                {"charged": "c-2"},
            ]
        assert SECRET not in await all_payloads(cyclone_env)
        info = await run.info()
        assert info.input == {"holder": "Ada", "number": SECRET}
        assert info.output == {"charged": SECRET}


async def test_a_workflow_with_outputs_signal_and_map(cyclone_env: CycloneEnv) -> None:
    async with client_with(cyclone_env, ring("new")) as client:
        run = await billing.submit(client, Card("Ada", SECRET))
        mapped = await doubling.submit(client, [1, 2, 3])
        await client.signal(run.id, "approval", [10, 20, 12])  # kept until it is reached
        async with fast_worker(client, workflows=[billing, doubling]):
            assert await run.result(timeout=30) == f"Ada: {SECRET}"
            assert await mapped.result(timeout=30) == [2, 4, 6]
        payloads = await run.payloads()
        assert payloads.nodes["approval"].signal == [10, 20, 12]
        assert payloads.nodes["total"].output == 42
        stored = await all_payloads(cyclone_env)
        assert SECRET not in stored
        total_output = await cyclone_env.pool.fetchval(
            "SELECT output FROM public.cyclone_steps WHERE run_id = $1 AND node = 'total'", run.id
        )
        assert json.loads(total_output).keys() == {"$cyclone.sealed", "data"}
        # A list is sealed item by item: map nodes split it in the database.
        assert (
            await cyclone_env.pool.fetchval(
                "SELECT jsonb_array_length(input) FROM public.cyclone_runs WHERE id = $1",
                mapped.id,
            )
            == 3
        )


async def test_error_messages_and_tracebacks_are_sealed(cyclone_env: CycloneEnv) -> None:
    async with client_with(cyclone_env, ring("new")) as client:
        run = await refuse.enqueue(client, Card("Ada", SECRET))
        async with fast_worker(client, steps=[refuse]):
            assert await run.wait(timeout=30) == cyclone.RunState.FAILED
        stored = await all_payloads(cyclone_env)
        assert SECRET not in stored
        assert "RuntimeError" in stored  # the error type stays clear
        info = await run.info()
        assert info.error is not None and f"declined {SECRET}" in info.error["message"]
        with pytest.raises(cyclone.RunFailedError, match=f"declined {SECRET}"):
            await run.result(timeout=30)
        (why,) = (await client.explain(run.id)).reasons
        assert f"RuntimeError: declined {SECRET}" in why.message
    async with client_with(cyclone_env, None) as bare:
        info = await (await bare.get_run(run.id)).info()
        assert info.error is not None and info.error["message"] == "<encrypted with key new>"
        (why,) = (await bare.explain(run.id)).reasons
        assert "RuntimeError: <encrypted with key new>" in why.message


async def test_plaintext_rows_from_before_still_read(cyclone_env: CycloneEnv) -> None:
    async with client_with(cyclone_env, None) as plain:
        run = await charge.enqueue(plain, Card("Ada", SECRET))
    async with client_with(cyclone_env, ring("new")) as client:
        handle = await client.get_run(run.id, dict)
        async with fast_worker(client, steps=[charge]):
            assert await handle.result(timeout=30) == {"charged": SECRET}
        assert (await handle.info()).input == {"holder": "Ada", "number": SECRET}
        # Its output was written after: sealed.
        assert SECRET not in await raw(cyclone_env, "SELECT output FROM public.cyclone_runs")


async def test_a_client_without_the_key_gets_a_clear_error(cyclone_env: CycloneEnv) -> None:
    async with client_with(cyclone_env, ring("new")) as sealed:
        run = await echo.enqueue(sealed, {"secret": SECRET})
    async with client_with(cyclone_env, ring("old")) as wrong:
        # A worker without the key fails the attempt with the reason, and does not loop.
        async with fast_worker(wrong, steps=[echo]):
            assert await run.wait(timeout=30) == cyclone.RunState.FAILED
        # Read by the worker's client: its error message is sealed with its own key.
        info = await (await wrong.get_run(run.id)).info()
        assert info.error is not None and info.error["type"] == "KeyringError"
        assert "'new'" in info.error["message"] and "add that key" in info.error["message"]
        assert info.input == "<encrypted with key new>"
    async with client_with(cyclone_env, ring("new")) as sealed:
        done = await echo.enqueue(sealed, {"secret": SECRET})
        async with fast_worker(sealed, steps=[echo]):
            await done.wait(timeout=30)
    async with client_with(cyclone_env, None) as bare:
        handle = await bare.get_run(done.id, dict)
        with pytest.raises(cyclone.KeyringError, match="no keyring"):
            await handle.result(timeout=30)


async def test_submit_once_compares_opened_inputs(cyclone_env: CycloneEnv) -> None:
    async with client_with(cyclone_env, ring("old")) as first:
        run, created = await billing.submit_once(first, "k", Card("Ada", SECRET))
        assert created
        again, created = await billing.submit_once(first, "k", Card("Ada", SECRET))
        assert (again.id, created) == (run.id, False)
        with pytest.raises(cyclone.SubmitConflictError) as conflict:
            await billing.submit_once(first, "k", Card("Ada", "other"))
        assert conflict.value.run_id == run.id
    # After a rotation to a new key, the old run's input still compares.
    async with client_with(cyclone_env, ring("new", "old")) as rotated:
        again, created = await billing.submit_once(rotated, "k", Card("Ada", SECRET))
        assert (again.id, created) == (run.id, False)
        with pytest.raises(cyclone.SubmitConflictError):
            await billing.submit_once(rotated, "k", Card("Bo", SECRET))
    # A run stored in the clear before sealing was turned on compares too.
    async with client_with(cyclone_env, None) as plain:
        clear, _ = await billing.submit_once(plain, "clear", Card("Ada", SECRET))
    async with client_with(cyclone_env, ring("new")) as sealed:
        again, created = await billing.submit_once(sealed, "clear", Card("Ada", SECRET))
        assert (again.id, created) == (clear.id, False)
        with pytest.raises(cyclone.SubmitConflictError):
            await billing.submit_once(sealed, "clear", Card("Bo", SECRET))
    # Without the key, a sealed run's input cannot be compared: the error says why.
    async with client_with(cyclone_env, None) as bare:
        with pytest.raises(cyclone.KeyringError):
            await billing.submit_once(bare, "k", Card("Ada", SECRET))


DRAINED: Counter[int] = Counter()


@cyclone.step("sealed.square", queue="rotate", max_attempts=3)
async def square(ctx: cyclone.Context, n: int) -> dict[str, int]:
    DRAINED[n] += 1
    return {"n": n, "square": n * n}


async def test_rotation_while_a_worker_drains(cyclone_env: CycloneEnv) -> None:
    DRAINED.clear()
    count = 300
    async with client_with(cyclone_env, ring("old")) as before:
        runs = await square.enqueue_many(before, list(range(count)))
        failed = await refuse.enqueue(before, Card("Ada", SECRET))
        async with fast_worker(before, steps=[refuse]):
            await failed.wait(timeout=30)
        assert (await before.keys.count()).keys() == {"old"}
    async with client_with(cyclone_env, ring("new", "old")) as client:
        handles = [await client.get_run(r.id, dict) for r in runs]
        rotated = 0
        async with fast_worker(client, steps=[square], queues={"rotate": 8}):
            drained = asyncio.gather(*(h.wait(timeout=120) for h in handles))
            # Small batches: many short transactions interleave with the worker's writes.
            while not drained.done():
                rotated += await client.keys.rotate(batch=7)
            await drained
        assert rotated > 0
        rotated += await client.keys.rotate()  # what a worker held locked meanwhile
        assert (await client.keys.count()).keys() == {"new"}
        # Every job ran once and kept its own output, written by the worker or re-sealed.
        assert Counter(range(count)) == DRAINED
        for n, handle in enumerate(handles):
            assert await handle.result(timeout=30) == {"n": n, "square": n * n}
    # The old key can go: a client with the new key alone reads everything.
    async with client_with(cyclone_env, ring("new")) as after:
        info = await (await after.get_run(failed.id)).info()
        assert info.input == {"holder": "Ada", "number": SECRET}
        assert info.error is not None and f"declined {SECRET}" in info.error["message"]
        # Re-sealed where it sat: the error record's type and times are still clear.
        errors = await raw(
            cyclone_env, "SELECT errors FROM public.cyclone_runs WHERE id = $1", failed.id
        )
        assert '"type": "RuntimeError"' in errors and SECRET not in errors


async def test_keys_without_a_keyring(cyclone_env: CycloneEnv) -> None:
    async with client_with(cyclone_env, None) as bare:
        await charge.enqueue(bare, Card("Ada", SECRET))
        assert await bare.keys.count() == {}
        with pytest.raises(cyclone.KeyringError, match="needs a keyring"):
            await bare.keys.rotate()


NIGHTLY: list[Any] = []
FIRED = asyncio.Event()


@cyclone.step("sealed.nightly")
async def nightly(ctx: cyclone.Context, value: dict[str, str]) -> None:
    NIGHTLY.append(value)
    FIRED.set()


async def test_a_dynamic_schedule_input_is_sealed(cyclone_env: CycloneEnv) -> None:
    global FIRED
    FIRED = asyncio.Event()
    NIGHTLY.clear()
    async with client_with(cyclone_env, ring("old")) as before:
        s = cyclone.schedule("sealed.nightly", nightly, cron="@yearly", input={"s": SECRET})
        await before.schedules.create(s)
    stored = await raw(cyclone_env, "SELECT input FROM public.cyclone_schedules")
    assert SECRET not in stored and '"$cyclone.sealed": "old"' in stored
    async with client_with(cyclone_env, ring("new", "old")) as client:
        assert await client.keys.rotate() == 1
        assert await client.keys.count() == {"new": 1}
        async with fast_worker(client, steps=[nightly]):
            await client.schedules.trigger(s.name)
            await asyncio.wait_for(FIRED.wait(), 30)
    assert NIGHTLY == [{"s": SECRET}]


branching = cyclone.define("sealed.branching", Card)
first = branching.node(charge)
branching.node(receipt, after=[first.when({"charged": "x"})])


async def test_branches_are_refused_before_anything_is_written(cyclone_env: CycloneEnv) -> None:
    async with client_with(cyclone_env, ring("new")) as client:
        with pytest.raises(cyclone.InvalidInputError, match=r"branches .* sealed outputs"):
            await branching.submit(client, Card("Ada", SECRET))
    assert await count_rows(cyclone_env, "cyclone_runs") == 0


inner = cyclone.define_result("sealed.inner", Card, dict[str, str])
inner.set_result(inner.node(charge))
outer = cyclone.define_result("sealed.outer", Card, dict[str, str])
outer.set_result(outer.child(inner, name="pay"))


@cyclone.step("sealed.odd_fails", max_attempts=1)
async def odd_fails(ctx: cyclone.Context, n: int) -> int:
    if n % 2:
        raise ValueError(f"odd {n}")
    return n * 10


settling = cyclone.define_result("sealed.settling", list[int], list[cyclone.Settled[int]])
settling.set_result(settling.map(odd_fails, settle=True))


async def test_child_runs_and_settled_maps(cyclone_env: CycloneEnv) -> None:
    async with client_with(cyclone_env, ring("new")) as client:
        run = await outer.submit(client, Card("Ada", SECRET))
        settled = await settling.submit(client, [1, 2])
        async with fast_worker(client, workflows=[outer, settling]):  # serves the child too
            assert await run.result(timeout=30) == {"charged": SECRET}
            items = await settled.result(timeout=30)
        assert items[1].value == 20 and items[0].error is not None
        assert "odd 1" in items[0].error["message"]
        kid = await raw(
            cyclone_env, "SELECT input FROM public.cyclone_runs WHERE parent_run = $1", run.id
        )
        assert '"$cyclone.sealed": "new"' in kid
        assert SECRET not in await all_payloads(cyclone_env)
        assert "odd 1" not in await all_payloads(cyclone_env)


async def test_the_sync_client_seals_and_opens(cyclone_env: CycloneEnv) -> None:
    import psycopg_pool

    import cyclone.sync

    def write(pool: psycopg_pool.ConnectionPool) -> cyclone.sync.ResultRun[Any]:
        client = cyclone.sync.Client(pool, cipher=ring("new"))
        job = client.enqueue(charge, Card("Ada", SECRET))
        run, created = client.submit_once(billing, "sync", Card("Ada", SECRET))
        again, created_again = client.submit_once(billing, "sync", Card("Ada", SECRET))
        assert created and not created_again and again.id == run.id
        with pytest.raises(cyclone.SubmitConflictError):
            client.submit_once(billing, "sync", Card("Bo", SECRET))
        client.signal(run.id, "approval", {"pin": SECRET})
        return job

    with psycopg_pool.ConnectionPool(cyclone_env.dsn, min_size=1, max_size=2) as pool:
        job = await asyncio.to_thread(write, pool)
        rows = await cyclone_env.pool.fetch(
            "SELECT input::text FROM cyclone_runs UNION ALL "
            "SELECT signal::text FROM cyclone_steps WHERE signal IS NOT NULL"
        )
        assert len(rows) == 3
        assert all(SECRET not in r[0] and "$cyclone.sealed" in r[0] for r in rows)
        async with (
            client_with(cyclone_env, ring("new")) as client,
            fast_worker(client, steps=[charge]),
        ):
            await (await client.get_run(job.id)).wait(timeout=30)
        assert await asyncio.to_thread(job.result, 30) == {"charged": SECRET}
        bare = cyclone.sync.Client(pool).get_run(job.id, dict)
        with pytest.raises(cyclone.KeyringError):
            await asyncio.to_thread(bare.result, 30)
