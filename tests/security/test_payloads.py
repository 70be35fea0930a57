"""Payloads JSON or jsonb cannot carry are refused before anything is written; what they can
carry comes back exactly. Errors stored from handlers are always storable and bounded."""

from __future__ import annotations

import math
from typing import Any

import msgspec
import pytest

import cyclone
from cyclone.testing.plugin import CycloneEnv
from tests.cli.process import cli, one_line_error
from tests.conftest import count_rows


class Reading(msgspec.Struct):
    value: float
    tags: list[str] = []


@cyclone.step("sec.payload", queue="sec_payload")
async def keep(ctx: cyclone.Context, value: Any) -> Any:
    return value


@cyclone.step("sec.reading", queue="sec_payload")
async def reading(ctx: cyclone.Context, value: Reading) -> float:
    return value.value


def _nested(depth: int) -> Any:
    value: Any = []
    for _ in range(depth):
        value = [value]
    return value


UNCARRIABLE = [
    ("a\x00b", "contains a NUL character, which jsonb cannot store"),
    ({"k": ["x\x00"]}, "contains a NUL character"),
    ("lone \udc80", "cannot be encoded as JSON"),
    ({"lone \ud800": 1}, "cannot be encoded as JSON"),
    (_nested(5000), "is nested too deeply to encode as JSON"),
    (math.nan, "contains a NaN or infinite float, which JSON cannot carry"),
    ({"a": [1, None, math.inf]}, "contains a NaN or infinite float"),
    ([-math.inf], "contains a NaN or infinite float"),
]


@pytest.mark.parametrize(("value", "message"), UNCARRIABLE)
async def test_what_json_cannot_carry_is_refused(
    cyclone_env: CycloneEnv, value: Any, message: str
) -> None:
    with pytest.raises(cyclone.InvalidInputError, match=message):
        await keep.enqueue(cyclone_env.client, value)
    async with cyclone_env.pool.acquire() as conn, conn.transaction():
        with pytest.raises(cyclone.InvalidInputError, match=message):
            await keep.enqueue_many_tx(cyclone_env.client, conn, [1, value])
    assert await count_rows(cyclone_env, "cyclone_runs") == 0


async def test_a_nan_inside_a_struct_is_refused(cyclone_env: CycloneEnv) -> None:
    with pytest.raises(cyclone.InvalidInputError, match="NaN or infinite"):
        await reading.enqueue(cyclone_env.client, Reading(math.nan))
    assert await count_rows(cyclone_env, "cyclone_runs") == 0


async def test_an_escaped_backslash_before_u0000_is_not_a_nul(cyclone_env: CycloneEnv) -> None:
    run = await keep.enqueue(cyclone_env.client, "\\u0000 and null")
    await cyclone_env.drain(steps=[keep])
    assert await run.result(timeout=30) == "\\u0000 and null"


EXACT = [
    2**64,
    -(2**80) - 1,
    10**40,
    5e-324,
    -0.5,
    {"deep": _nested(400), "none": None, "text": "é😀\u2028"},
]


@pytest.mark.parametrize("value", EXACT)
async def test_what_json_can_carry_comes_back_exactly(cyclone_env: CycloneEnv, value: Any) -> None:
    run = await keep.enqueue(cyclone_env.client, value)
    await cyclone_env.drain(steps=[keep])
    assert await run.result(timeout=30) == value


async def test_floats_come_back_as_floats_when_typed(cyclone_env: CycloneEnv) -> None:
    # jsonb prints 1.7976931348623157e308 as a 309-digit integer: decoded as Any, that is an
    # int; a float field (or output type) turns it back into the same float.
    run = await reading.enqueue(cyclone_env.client, Reading(1.7976931348623157e308))
    await cyclone_env.drain(steps=[reading])
    assert await run.result(timeout=30) == 1.7976931348623157e308


async def test_the_cli_signal_payload_goes_through_the_same_rules(cyclone_env: CycloneEnv) -> None:
    flow = cyclone.define("sec.signalled", int)
    flow.wait("approve")
    run = await flow.submit(cyclone_env.client, 1)
    before = await run.info()
    deep = "[" * 5000 + "]" * 5000
    for payload in ('"a\\u0000b"', deep):
        code, _, err = await cli("runs", "signal", str(run.id), "approve", "--payload", payload,
                                 dsn=cyclone_env.dsn)  # fmt: skip
        assert one_line_error(code, err) in (
            "cyclone: signal payload contains a NUL character, which jsonb cannot store",
            "cyclone: --payload is nested too deeply to decode",
        )
    after = await run.info()
    assert (after.state, after.nodes) == (before.state, before.nodes)  # nothing was written


class Nasty(Exception):
    """An exception whose message jsonb cannot store as it is, and is huge."""


@cyclone.step("sec.nasty", queue="sec_payload", max_attempts=1)
async def nasty(ctx: cyclone.Context, size: int) -> None:
    raise Nasty("start \x00 nul \udc80 lone " + "x" * size + " END")


async def test_a_handler_error_jsonb_cannot_store_is_kept_readable(cyclone_env: CycloneEnv) -> None:
    run = await nasty.enqueue(cyclone_env.client, 1_000_000)
    await cyclone_env.drain(steps=[nasty])
    info = await run.info()
    assert info.state == cyclone.RunState.FAILED
    [error] = info.nodes[0].errors
    assert error["type"] == "Nasty"  # the handler's error, not a lost lease
    message, traceback = error["message"], error["traceback"]
    assert len(message) == 2000 and message.startswith("start \ufffd nul \ufffd lone x")
    assert " [...] " in message and message.endswith("x END")
    assert len(traceback) == 8000 and traceback.startswith("Traceback")
    assert "in nasty" in traceback and traceback.endswith("x END\n")
    short = await nasty.enqueue(cyclone_env.client, 3)
    await cyclone_env.drain(steps=[nasty])
    [error] = (await short.info()).nodes[0].errors
    assert error["message"] == "start \ufffd nul \ufffd lone xxx END"
