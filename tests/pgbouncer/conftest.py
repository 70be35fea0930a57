"""A PgBouncer in transaction pooling mode in front of the session's PostgreSQL.

Started once per session by :func:`pgbouncer` (skipped when no ``pgbouncer`` binary is
installed: ``apt-get install pgbouncer``), listening on a free port of 127.0.0.1 and run by an
unprivileged account (PgBouncer refuses to run as root). Every database name is forwarded to the
session's server, so each test's own database is reachable through it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from cyclone.testing._postgres import PostgresServer, free_port, server_account


@dataclass(frozen=True)
class Bouncer:
    """A running PgBouncer: where it listens and its version."""

    port: int
    version: str

    def dsn_for(self, dsn: str) -> str:
        """``dsn`` (a database on the session's server) rewritten to go through PgBouncer."""
        return urlsplit(dsn)._replace(netloc=f"postgres@127.0.0.1:{self.port}").geturl()


@pytest.fixture(scope="session")
def pgbouncer(cyclone_server: PostgresServer) -> Iterator[Bouncer]:
    """A PgBouncer (pool_mode=transaction) forwarding every database to the session's server."""
    binary = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"
    if not Path(binary).is_file():
        pytest.skip("no pgbouncer binary (apt-get install pgbouncer)")
    server = urlsplit(cyclone_server.dsn)
    account = server_account()
    tmp = Path(tempfile.mkdtemp(prefix="cyclone-pgbouncer-"))
    port = free_port()
    (tmp / "userlist.txt").write_text('"postgres" ""\n')
    (tmp / "pgbouncer.ini").write_text(
        "[databases]\n"
        f"* = host={server.hostname} port={server.port}\n"
        "[pgbouncer]\n"
        "listen_addr = 127.0.0.1\n"
        f"listen_port = {port}\n"
        "unix_socket_dir =\n"
        "auth_type = trust\n"
        f"auth_file = {tmp / 'userlist.txt'}\n"
        "pool_mode = transaction\n"
        "default_pool_size = 10\n"
        "max_client_conn = 200\n"
        f"logfile = {tmp / 'pgbouncer.log'}\n"
    )
    if account:
        for path in tmp.iterdir():
            os.chown(path, account.pw_uid, account.pw_gid)
        os.chown(tmp, account.pw_uid, account.pw_gid)
    version = subprocess.run(
        [binary, "--version"], capture_output=True, text=True, check=True
    ).stdout.split("\n")[0]
    process = subprocess.Popen(
        [binary, str(tmp / "pgbouncer.ini")],
        cwd=tmp,
        user=account.pw_uid if account else None,
        group=account.pw_gid if account else None,
        extra_groups=[] if account else None,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,  # it logs to its logfile
    )
    try:
        _wait_for_port(port, process, tmp)
        yield Bouncer(port, version)
    finally:
        process.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(30)
        if process.returncode is None:
            process.kill()
            process.wait()
        shutil.rmtree(tmp, ignore_errors=True)


def _wait_for_port(port: int, process: subprocess.Popen[bytes], tmp: Path) -> None:
    deadline = time.monotonic() + 60
    while True:
        if process.poll() is not None:
            log = (
                (tmp / "pgbouncer.log").read_text(errors="replace")
                if (tmp / "pgbouncer.log").exists()
                else ""
            )
            raise RuntimeError(f"pgbouncer exited with {process.returncode}:\n{log}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 1):
            return
        if time.monotonic() > deadline:
            raise TimeoutError("pgbouncer did not listen within 60 s")
        time.sleep(0.05)
