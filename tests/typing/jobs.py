"""Jobs: enqueue options are typed, handles carry the kind's output type."""

from __future__ import annotations

import datetime as dt
from typing import Any, assert_type

import msgspec

import cyclone
import cyclone.testing


class Email(msgspec.Struct):
    to: str


@cyclone.step("mail.send", queue="mail")
async def send(ctx: cyclone.Context, email: Email) -> int:
    return len(email.to)


@cyclone.action("mail.log")
async def log(ctx: cyclone.Context, email: Email) -> None:
    return None


@cyclone.step("any.echo")
async def echo(ctx: cyclone.Context, value: object) -> str:
    return repr(value)


async def steps(client: cyclone.Client, tx: cyclone.Tx, email: Email) -> None:
    assert_type(send, cyclone.Step[Email, int])
    assert_type(log, cyclone.Step[Email, None])
    assert_type(await send(cyclone.testing.new_context(), email), int)
    assert_type(await send.enqueue(client, email), cyclone.ResultRun[int])
    assert_type(await send.enqueue_tx(client, tx, email), cyclone.ResultRun[int])
    assert_type(await send.enqueue_many(client, [email]), list[cyclone.ResultRun[int]])
    assert_type(await send.enqueue_many_tx(client, tx, [email]), list[cyclone.ResultRun[int]])
    assert_type(await log.enqueue(client, email), cyclone.ResultRun[None])
    assert_type(await cyclone.enqueue(client, send, email), cyclone.ResultRun[int])
    assert_type(await cyclone.enqueue_tx(client, tx, send, email), cyclone.ResultRun[int])
    assert_type(await cyclone.enqueue_many(client, send, [email]), list[cyclone.ResultRun[int]])
    assert_type(
        await cyclone.enqueue_many_tx(client, tx, send, [email]), list[cyclone.ResultRun[int]]
    )
    assert_type(await (await send.enqueue(client, email)).result(), int)
    # A step taking object takes anything (steps are contravariant in their input).
    wide: cyclone.Kind[Email, str] = echo
    assert_type(await wide.enqueue(client, email), cyclone.ResultRun[str])


async def every_option(client: cyclone.Client, email: Email) -> None:
    await send.enqueue(
        client,
        email,
        queue="urgent",
        process_at=dt.datetime.now(dt.UTC),
        unique="k",
        sequence="s",
        priority=5,
        max_attempts=3,
        run_deadline=dt.datetime.now(dt.UTC),
    )
    await send.enqueue(client, email, process_in=dt.timedelta(seconds=5))
    await send.enqueue(client, email, process_in=1.5)
    await send.enqueue(client, email, process_in=2)
    await send.enqueue(client, email, expires_in=dt.timedelta(minutes=5))
    await send.enqueue_many(client, [email], expires_at=dt.datetime.now(dt.UTC))
    options: cyclone.EnqueueOptions = {"queue": "mail", "priority": 1}
    await send.enqueue(client, email, **options)
    many: cyclone.EnqueueManyOptions = {"sequence": "s"}
    await send.enqueue_many(client, [email], **many)


def latest(old: Email, new: Email) -> Email:
    return new


async def gates(client: cyclone.Client, tx: cyclone.Tx, email: Email) -> None:
    debounce = cyclone.Debounce("k", dt.timedelta(seconds=5), max_wait=60, merge=latest)
    assert_type(debounce, cyclone.Debounce[Email])
    run = await send.enqueue(client, email, debounce=debounce)
    assert_type(run.created, bool)
    await send.enqueue_tx(client, tx, email, debounce=cyclone.Debounce("k", 0.5))
    await cyclone.enqueue(client, send, email, throttle=cyclone.Throttle("k", 60))
    await send.enqueue_many(client, [email], debounce=debounce)  # type: ignore[call-arg]
    await send.enqueue(client, email, throttle="k")  # type: ignore[arg-type]
    cyclone.Debounce("k", "soon")  # type: ignore[arg-type]


async def wrong_options(client: cyclone.Client, tx: cyclone.Tx, email: Email) -> None:
    await send.enqueue(client, email, priority="high")  # type: ignore[arg-type]
    await send.enqueue(client, email, prio=1)  # type: ignore[call-arg]
    await send.enqueue(client, email, process_in="soon")  # type: ignore[arg-type]
    await send.enqueue(client, email, expires_in="soon")  # type: ignore[arg-type]
    await send.enqueue_tx(client, tx, email, max_attempts=2.5)  # type: ignore[arg-type]
    await cyclone.enqueue(client, send, email, queue=None)  # type: ignore[arg-type]
    await send.enqueue_many(client, [email], unique="k")  # type: ignore[call-arg]
    await cyclone.enqueue_many_tx(client, tx, send, [email], unique="k")  # type: ignore[call-arg]


async def wrong_inputs(client: cyclone.Client) -> None:
    await send.enqueue(client, {"to": "a"})  # type: ignore[arg-type]
    await cyclone.enqueue(client, send, "a")  # type: ignore[misc]
    await send.enqueue_many(client, ["a"])  # type: ignore[list-item]
    run: cyclone.ResultRun[str] = await send.enqueue(client, Email("a"))  # type: ignore[assignment]
    del run


def registered() -> None:
    assert_type(cyclone.register_kind("mail.send", Email, int), cyclone.Kind[Email, int])
    assert_type(cyclone.register_kind("mail.log", Email, None), cyclone.Kind[Email, None])
    assert_type(cyclone.register_kind("x", Email, int | None), cyclone.Kind[Any, Any])
