"""Batch steps: the item types come from the handler, results may be ItemFailed."""

from __future__ import annotations

from typing import assert_type

import msgspec

import cyclone


class Sms(msgspec.Struct):
    to: str


@cyclone.batch_step("sms.send", queue="sms", max_size=50, max_wait=0.5, max_attempts=3)
async def send(ctx: cyclone.BatchContext, messages: list[Sms]) -> list[int | cyclone.ItemFailed]:
    assert_type(ctx.client, cyclone.Client)
    conn = await ctx.completion_tx()
    await conn.execute("SELECT 1")
    follow = await cyclone.enqueue_completion(ctx, ctx.client, count, messages[0])
    assert_type(follow, cyclone.ResultRun[int])
    return [len(m.to) if m.to else cyclone.ItemFailed(ValueError("no number")) for m in messages]


@cyclone.batch_step("sms.count", group_by=lambda sms: sms.to[:3])
async def count(ctx: cyclone.BatchContext, messages: list[Sms]) -> list[int]:
    return [len(messages)] * len(messages)


@cyclone.batch_action("sms.log")
async def log(ctx: cyclone.BatchContext, messages: list[Sms]) -> None:
    return None


@cyclone.batch_action("sms.check")
async def check(ctx: cyclone.BatchContext, messages: list[Sms]) -> list[cyclone.ItemFailed | None]:
    return [None for _ in messages]


async def batches(client: cyclone.Client, sms: Sms) -> None:
    assert_type(send, cyclone.BatchStep[Sms, int])
    assert_type(count, cyclone.BatchStep[Sms, int])
    assert_type(log, cyclone.BatchStep[Sms, None])
    assert_type(check, cyclone.BatchStep[Sms, None])
    assert_type(await send.enqueue(client, sms), cyclone.ResultRun[int])
    assert_type(await cyclone.enqueue_many(client, send, [sms]), list[cyclone.ResultRun[int]])
    cyclone.Worker(client, steps=[send, count, log, check])
    step: cyclone.Step[Sms, int] = send  # a batch step is a step
    assert step.name == "sms.send"


@cyclone.batch_step("sms.wrong")  # type: ignore[arg-type]
async def wrong(ctx: cyclone.BatchContext, message: Sms) -> list[int]:
    return [1]
