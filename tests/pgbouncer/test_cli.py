"""The ``cyclone`` command behind PgBouncer in transaction pooling mode."""

from __future__ import annotations

import asyncio
import signal

from cyclone.testing.plugin import CycloneEnv
from tests.cli.app import echo
from tests.cli.process import cli, environment, line_with, start
from tests.conftest import reaped
from tests.pgbouncer.conftest import Bouncer


async def test_the_cli_behind_pgbouncer(cyclone_env: CycloneEnv, pgbouncer: Bouncer) -> None:
    bouncer = pgbouncer.dsn_for(cyclone_env.dsn)
    # Transaction pooling hands each transaction any server connection: asyncpg's named
    # prepared statements and LISTEN cannot work there.
    pooled = ("--statement-cache-size", "0", "--no-notify")
    for args in (["runs", "ls"], ["stats"], ["migrate"]):
        code, _, err = await cli(*pooled, *args, dsn=bouncer)
        assert code == 0, (args, err)
    env = {**environment(bouncer), "CYCLONE_STATEMENT_CACHE_SIZE": "0", "CYCLONE_NOTIFY": "0"}
    code, _, err = await cli("runs", "ls", env=env)
    assert code == 0, err
    worker = await start("worker", "tests.cli.app:WORK", "--poll-interval", "0.1", env=env)
    async with reaped(worker):
        await line_with(worker, "running; Ctrl-C stops it")
        run = await echo.enqueue(cyclone_env.client, 8)
        assert await run.result(timeout=60) == 8
        worker.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(worker.wait(), 60) == 0
