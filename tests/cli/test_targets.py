"""What ``cyclone worker MODULE:OBJECT`` imports and accepts."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

import pytest

import cyclone
from cyclone.testing.plugin import CycloneEnv
from tests.cli.app import echo
from tests.cli.process import cli, environment, line_with, one_line_error, start
from tests.conftest import reaped

ACCEPTED = (
    "give a step, a workflow, a list of them, or a function that takes the client and "
    "returns a cyclone.Worker"
)
MYJOBS = """
import cyclone

@cyclone.step("myjobs.hello", queue="myjobs")
async def hello(ctx: cyclone.Context, name: str) -> str:
    return f"hello {name}"

WORK = [hello]
"""


@cyclone.step("myjobs.hello", queue="myjobs")
async def hello(ctx: cyclone.Context, name: str) -> str:
    raise AssertionError("the worker subprocess runs the handler, not this test")


async def test_the_current_directory_is_importable(cyclone_env: CycloneEnv, tmp_path: Path) -> None:
    (tmp_path / "myjobs.py").write_text(MYJOBS)
    env = environment(cyclone_env.dsn, pythonpath=False)  # as a user runs it: no PYTHONPATH
    async with reaped(await start("worker", "myjobs:WORK", cwd=tmp_path, env=env)) as proc:
        await line_with(proc, "running; Ctrl-C stops it")
        run = await hello.enqueue(cyclone_env.client, "you")
        assert await run.result(timeout=60) == "hello you"
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), 60) == 0


@pytest.mark.parametrize(
    ("target", "found"),
    [
        (
            "tests.cli.app:helper",
            "is function helper(), which cannot be called with the client",
        ),
        ("tests.cli.app:NOT_A_TARGET", "is int 42"),
        ("tests.cli.app:MIXED", "is a list holding str 'cli.echo'"),
        (
            "tests.cli.app:echo.handler",
            "is function echo(ctx, n), which",
        ),
    ],
)
async def test_a_target_that_is_not_work(cyclone_env: CycloneEnv, target: str, found: str) -> None:
    code, _, err = await cli("worker", target, dsn=cyclone_env.dsn)
    line = one_line_error(code, err)
    assert line.startswith(f"cyclone: {target} {found}") and line.endswith(ACCEPTED), line


async def test_a_factory_returning_something_else(cyclone_env: CycloneEnv) -> None:
    code, _, err = await cli("worker", "tests.cli.app:make_nothing", dsn=cyclone_env.dsn)
    assert one_line_error(code, err) == (
        "cyclone: tests.cli.app:make_nothing returned int 1, not a cyclone.Worker"
    )


async def test_an_async_factory(cyclone_env: CycloneEnv) -> None:
    target = "tests.cli.app:make_worker_async"
    async with reaped(await start("worker", target, dsn=cyclone_env.dsn)) as proc:
        await line_with(proc, "running; Ctrl-C stops it")
        run = await echo.enqueue(cyclone_env.client, 3)
        assert await run.result(timeout=60) == 3
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), 60) == 0
