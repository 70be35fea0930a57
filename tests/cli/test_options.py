"""Connection options: before or after the subcommand, and behind PgBouncer."""

from __future__ import annotations

import asyncio
import contextlib
import os
import pwd
import shutil
import signal
import socket
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest

import cyclone
from cyclone._sql import MIGRATIONS
from cyclone.testing.plugin import CycloneEnv
from tests.cli.app import echo
from tests.cli.process import cli, environment, line_with, one_line_error, start
from tests.conftest import reaped


async def test_connection_options_after_the_subcommand(cyclone_env: CycloneEnv) -> None:
    dsn = cyclone_env.dsn
    code, out, err = await cli("migrate", "--dsn", dsn, "--schema", "after")
    versions = [m.version for m in MIGRATIONS]
    assert (code, out.strip()) == (0, f"applied: {versions}; schema after is at {versions}"), err
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


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _configure(dsn: str, folder: Path, account: pwd.struct_passwd | None) -> tuple[str, str]:
    """Write PgBouncer's files into ``folder``; return the binary and PgBouncer's DSN."""
    binary = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"
    if not os.path.exists(binary):
        pytest.skip("pgbouncer is not installed")
    url = urlsplit(dsn)
    port = _free_port()
    (folder / "users.txt").write_text(f'"{url.username}" ""\n')
    (folder / "pgbouncer.ini").write_text(
        f"[databases]\n* = host={url.hostname} port={url.port}\n"
        f"[pgbouncer]\nlisten_addr = 127.0.0.1\nlisten_port = {port}\nunix_socket_dir =\n"
        f"auth_type = trust\nauth_file = {folder / 'users.txt'}\npool_mode = transaction\n"
        "max_client_conn = 200\ndefault_pool_size = 40\n"
    )
    if account:  # its own folder, which the unprivileged account can enter
        for path in (folder, *folder.iterdir()):
            os.chown(path, account.pw_uid, account.pw_gid)
    return binary, url._replace(netloc=f"{url.username}@127.0.0.1:{port}").geturl()


@contextlib.asynccontextmanager
async def pgbouncer(dsn: str) -> AsyncIterator[str]:
    """A PgBouncer in transaction mode in front of ``dsn``'s server; yields its DSN."""
    account = pwd.getpwnam("nobody") if os.geteuid() == 0 else None  # it refuses root
    with tempfile.TemporaryDirectory(prefix="cyclone-pgbouncer-") as name:
        folder = Path(name)
        binary, bouncer = _configure(dsn, folder, account)
        proc = await asyncio.create_subprocess_exec(
            binary,
            str(folder / "pgbouncer.ini"),
            cwd=folder,
            user=account.pw_uid if account else None,
            group=account.pw_gid if account else None,
            extra_groups=[] if account else None,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
        )
        async with reaped(proc):
            await line_with(proc, "process up")
            yield bouncer
            proc.terminate()


async def test_behind_pgbouncer_in_transaction_mode(cyclone_env: CycloneEnv) -> None:
    async with pgbouncer(cyclone_env.dsn) as bouncer:
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
