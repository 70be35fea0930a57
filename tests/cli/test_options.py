"""Connection options: before or after the subcommand (behind PgBouncer: tests/pgbouncer)."""

from __future__ import annotations

import cyclone
from cyclone._storage.loader import MIGRATIONS
from cyclone.testing.plugin import CycloneEnv
from tests.cli.app import echo
from tests.cli.process import cli, one_line_error


async def test_connection_options_after_the_subcommand(cyclone_env: CycloneEnv) -> None:
    dsn = cyclone_env.dsn
    code, out, err = await cli("migrate", "--dsn", dsn, "--schema", "after")
    latest = MIGRATIONS[-1]
    assert code == 0, err
    assert out.strip().endswith(
        f"; schema after is up to date (migration {latest.version}, "
        f"{latest.version:04d}_{latest.name})"
    )
    run = await echo.enqueue(cyclone.Client(cyclone_env.pool, schema="after"), 1)
    for args in (
        ["runs", "ls", "--dsn", dsn, "--schema", "after"],
        ["runs", "--dsn", dsn, "--schema", "after", "ls"],
        ["runs", "show", str(run.id), "--dsn", dsn, "--schema", "after"],
        ["stats", "--dsn", dsn, "--schema", "after"],
        ["purge", "--older-than", "7d", "--dsn", dsn, "--schema", "after"],
    ):
        code, out, err = await cli(*args)
        assert code == 0, (args, err)
    code, out, _ = await cli("runs", "ls", "--dsn", dsn, "--schema", "after")
    assert str(run.id) in out
    # The subcommand's value wins over the group's and over the environment.
    code, out, _ = await cli("--schema", "public", "runs", "ls", "--schema", "after", dsn=dsn)
    assert str(run.id) in out
    code, _, err = await cli("runs", "ls", "--dsn", "postgresql://nobody@127.0.0.1:1/none", dsn=dsn)
    assert "cannot connect" in one_line_error(code, err)
