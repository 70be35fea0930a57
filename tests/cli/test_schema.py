"""The CLI on a schema that is not migrated: one line saying what to do, then exit 1."""

from __future__ import annotations

import asyncio
import signal

import pytest

import cyclone
from cyclone.testing.plugin import CycloneEnv
from tests.cli.app import echo
from tests.cli.process import cli, line_with, one_line_error, start
from tests.conftest import reaped

RUN = "00000000-0000-0000-0000-000000000000"
NOT_MIGRATED = (
    "cyclone: schema 'empty' has no Cyclone tables: run `cyclone migrate` "
    "(or `await client.migrate()`)"
)


@pytest.mark.parametrize(
    "args",
    [
        ["runs", "ls"],
        ["runs", "show", RUN],
        ["runs", "signal", RUN, "approve"],
        ["runs", "retry", RUN],
        ["runs", "cancel", RUN],
        ["stats"],
        ["purge", "--older-than", "7d"],
        ["worker", "tests.cli.app:WORK"],  # it used to log a missing relation forever
    ],
)
async def test_every_command_says_migrate(cyclone_env: CycloneEnv, args: list[str]) -> None:
    code, _, err = await cli("--schema", "empty", *args, dsn=cyclone_env.dsn)
    assert code == 1
    assert one_line_error(code, err) == NOT_MIGRATED


async def test_a_newer_schema_says_upgrade(cyclone_env: CycloneEnv) -> None:
    await cyclone.Client(cyclone_env.pool, schema="newer").migrate()
    await cyclone_env.pool.execute(
        "INSERT INTO newer.cyclone_migrations (version, name) VALUES (9999, 'from_the_future')"
    )
    for args in (["runs", "ls"], ["worker", "tests.cli.app:WORK", "--wait-for-migrations"]):
        code, _, err = await cli("--schema", "newer", *args, dsn=cyclone_env.dsn)
        line = one_line_error(code, err)
        assert "has Cyclone migrations 9999" in line and "upgrade cyclone-pg" in line


async def test_the_worker_can_wait_for_migrations(cyclone_env: CycloneEnv) -> None:
    client = cyclone.Client(cyclone_env.pool, schema="later")
    args = ("--schema", "later", "worker", "tests.cli.app:WORK", "--wait-for-migrations")
    async with reaped(await start(*args, "--poll-interval", "0.1", dsn=cyclone_env.dsn)) as proc:
        waiting = await line_with(proc, "waiting for migrations")
        assert "schema 'later' has no Cyclone tables: run `cyclone migrate`" in waiting
        code, _, err = await cli("--schema", "later", "migrate", dsn=cyclone_env.dsn)
        assert code == 0, err
        await line_with(proc, "running; Ctrl-C stops it")
        run = await echo.enqueue(client, 5)
        assert await run.result(timeout=60) == 5
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), 60) == 0


async def test_a_signal_stops_the_waiting_worker(cyclone_env: CycloneEnv) -> None:
    args = ("--schema", "never", "worker", "tests.cli.app:WORK", "--wait-for-migrations")
    async with reaped(await start(*args, dsn=cyclone_env.dsn)) as proc:
        await line_with(proc, "waiting for migrations")
        proc.send_signal(signal.SIGINT)
        assert await asyncio.wait_for(proc.wait(), 60) == 0
