"""Steps for the CLI's worker tests: ``cyclone worker tests.cli.app:WORK``."""

from __future__ import annotations

import asyncio

import cyclone


@cyclone.step("cli.echo", queue="cli")
async def echo(ctx: cyclone.Context, n: int) -> int:
    return n


@cyclone.step("cli.slow", queue="cli")
async def slow(ctx: cyclone.Context, seconds: float) -> float:
    await ctx.client.pool.execute("SELECT pg_notify('cli_started', $1)", str(ctx.run_id))
    await asyncio.sleep(seconds)
    return seconds


@cyclone.step("cli.fail", queue="cli", max_attempts=1)
async def fail(ctx: cyclone.Context, n: int) -> int:
    raise RuntimeError(f"failing on purpose ({n})")


pipeline = cyclone.define("cli.pipeline", int)
pipeline.node(echo, name="second", after=[pipeline.node(echo, name="first")])

# Node names that sort child first: `runs show` must not rely on the order nodes come in.
backwards = cyclone.define("cli.backwards", int)
backwards.node(echo, name="a_child", after=[backwards.node(echo, name="z_parent")])

# Every workflow that uses these steps: a worker given a step but not a workflow of it warns.
WORK = [echo, slow, fail, pipeline, backwards]


def make_worker(client: cyclone.Client) -> cyclone.Worker:
    """A target that builds its own worker."""
    return cyclone.Worker(client, steps=[echo])


approval = cyclone.define("cli.approval", int)
approval.wait("approve")

NOT_A_TARGET = 42
MIXED = [echo, "cli.echo"]


def helper() -> int:
    """A function that is not a worker factory: it takes no client."""
    return 1


def make_nothing(client: cyclone.Client) -> int:
    """A factory that returns something other than a Worker."""
    return 1


async def make_worker_async(client: cyclone.Client) -> cyclone.Worker:
    """An async factory."""
    return cyclone.Worker(client, steps=[echo], poll_interval=0.1)
