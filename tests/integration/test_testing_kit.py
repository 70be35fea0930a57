"""The pytest plugin's helpers: env.worker, env.drain, the cyclone_worker fixture."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import cyclone
from cyclone.testing.plugin import CycloneEnv
from tests.conftest import count_rows


@cyclone.step("kit.countdown")
async def countdown(ctx: cyclone.Context, n: int) -> int:
    if n > 0:  # each job enqueues the next: drain must follow the chain to the end
        await cyclone.enqueue_completion(ctx, ctx.client, countdown, n - 1)
    return n


async def test_drain_runs_until_nothing_is_claimable(cyclone_env: CycloneEnv) -> None:
    first = await countdown.enqueue(cyclone_env.client, 5)
    later = await countdown.enqueue(cyclone_env.client, 0, process_in=3600)
    await cyclone_env.drain(steps=[countdown])
    assert await first.status() is cyclone.RunState.COMPLETED
    page = await cyclone_env.client.list_runs(
        cyclone.RunQuery(name="kit.countdown", state=cyclone.RunState.COMPLETED)
    )
    assert len(page.runs) == 6
    assert await later.status() is cyclone.RunState.PENDING  # not due yet: not waited for
    assert await count_rows(cyclone_env, "cyclone_tasks") == 1


async def test_worker_fixture(
    cyclone_env: CycloneEnv, cyclone_worker: Callable[..., Awaitable[cyclone.Worker]]
) -> None:
    worker = await cyclone_worker(steps=[countdown])
    run = await countdown.enqueue(cyclone_env.client, 0)
    assert await run.result(timeout=30) == 0
    assert worker.poll_interval == 0.05
