"""PostgreSQL clusters of a chaos scenario's own: started, stopped, crashed, replicated, promoted.

A fault that kills or restarts a server must never touch the shared test cluster, so each
scenario builds its own from a data directory initialised once per session (copying it is much
faster than ``initdb``). We run as root in CI, so the servers run as an unprivileged account;
they listen on 127.0.0.1 only. Crash safety is kept where it matters here: ``fsync`` is off
(the operating system survives every fault we inject) but ``synchronous_commit`` is on, so an
immediate stop loses nothing that was acknowledged.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shlex
import shutil
import subprocess
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

from cyclone.testing._postgres import INITDB_OPTIONS, find_bindir, free_port, server_account

SETTINGS = {
    "listen_addresses": "127.0.0.1",
    "unix_socket_directories": "",
    "max_connections": "100",
    "shared_buffers": "64MB",
    "fsync": "off",
    "full_page_writes": "off",
    "synchronous_commit": "on",
    "track_commit_timestamp": "on",  # effect rows are timed by their commit
    "wal_level": "replica",
    "max_wal_senders": "4",
}


def require_server_binaries() -> None:
    """Skip the calling test module where no PostgreSQL server binaries are installed (the
    embedded wheel serves the shared test server, but clusters of a test's own need initdb,
    pg_ctl and pg_basebackup from a PostgreSQL install; CI installs one)."""
    try:
        find_bindir()
    except FileNotFoundError as exc:
        pytest.skip(f"{exc}: this module runs clusters of its own", allow_module_level=True)


class Cluster:
    """One PostgreSQL server on a data directory of its own, driven with ``pg_ctl``."""

    def __init__(self, root: Path, name: str, settings: Mapping[str, str] | None = None) -> None:
        self.bindir = find_bindir()
        self.account = server_account()
        self.root = root
        self.data = root / name
        self.log = root / f"{name}.log"
        self.port = free_port()
        self.settings = {**SETTINGS, **(settings or {})}

    @property
    def dsn(self) -> str:
        """The maintenance database's DSN."""
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def dsn_for(self, database: str) -> str:
        """The DSN of ``database`` on this server."""
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    def run(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        """Run a PostgreSQL program as the server's account; raise if it fails."""
        done = subprocess.run(
            [str(self.bindir / args[0]), *args[1:]],
            cwd=self.root,
            user=self.account.pw_uid if self.account else None,
            group=self.account.pw_gid if self.account else None,
            extra_groups=[] if self.account else None,
            capture_output=True,
            text=True,
            errors="replace",
            timeout=timeout,
            check=False,
        )
        if done.returncode:
            tail = self.log.read_text(errors="replace")[-3000:] if self.log.exists() else ""
            raise RuntimeError(f"{args[0]} failed:\n{done.stdout}{done.stderr}\n{tail}")
        return done

    def start(self) -> None:
        """Start the server and wait until it accepts connections."""
        opts = " ".join(
            [
                f"-p {self.port}",
                *(f"-c {shlex.quote(f'{k}={v}')}" for k, v in self.settings.items()),
            ]
        )
        self.run(
            "pg_ctl", f"--pgdata={self.data}", "--wait", "--timeout=120", f"--log={self.log}",
            "-o", opts, "start",
        )  # fmt: skip

    def stop(self, mode: str = "fast") -> None:
        """Stop the server (``mode="immediate"`` is a crash: no checkpoint, recovery on start)."""
        self.run("pg_ctl", f"--pgdata={self.data}", f"--mode={mode}", "--wait", "stop")

    def promote(self) -> None:
        """Turn this standby into a primary and wait until it accepts writes."""
        self.run("pg_ctl", f"--pgdata={self.data}", "--wait", "--timeout=120", "promote")

    @property
    def running(self) -> bool:
        """Whether a postmaster holds the data directory."""
        return (self.data / "postmaster.pid").exists()

    def standby(self, name: str) -> Cluster:
        """A streaming standby of this server made with ``pg_basebackup``, not yet started.

        It connects as ``application_name=name``, so the primary can name it in
        ``synchronous_standby_names``; its own settings leave out the primary's synchronous
        standby list, so after promotion it commits alone.
        """
        settings = {k: v for k, v in self.settings.items() if k != "synchronous_standby_names"}
        replica = Cluster(self.root, name, settings)
        conninfo = f"host=127.0.0.1 port={self.port} user=postgres application_name={name}"
        self.run(
            "pg_basebackup", f"--pgdata={replica.data}", f"--dbname={conninfo}",
            "--wal-method=stream", "--checkpoint=fast", "--write-recovery-conf",
        )  # fmt: skip
        return replica


def _chown(path: Path, account: pwd.struct_passwd | None) -> None:
    if account is None:
        return
    os.chown(path, account.pw_uid, account.pw_gid)
    for parent, dirs, files in os.walk(path):
        for entry in dirs + files:
            os.chown(os.path.join(parent, entry), account.pw_uid, account.pw_gid)


@contextlib.contextmanager
def template_data() -> Iterator[Path]:
    """A data directory made by ``initdb`` once, for clusters to copy; removed afterwards."""
    account = server_account()
    root = Path(tempfile.mkdtemp(prefix="cyclone-chaos-template-"))
    try:
        _chown(root, account)
        probe = Cluster(root, "data")
        probe.run("initdb", f"--pgdata={probe.data}", *INITDB_OPTIONS)
        yield probe.data
    finally:
        shutil.rmtree(root, ignore_errors=True)


@contextlib.contextmanager
def cluster_from(template: Path, settings: Mapping[str, str] | None = None) -> Iterator[Cluster]:
    """A started cluster copied from ``template``; it and any standby are removed afterwards."""
    account = server_account()
    root = Path(tempfile.mkdtemp(prefix="cyclone-chaos-"))
    try:
        _chown(root, account)
        primary = Cluster(root, "primary", settings)
        shutil.copytree(template, primary.data, symlinks=True)
        _chown(primary.data, account)
        os.chmod(primary.data, 0o700)
        primary.start()
        yield primary
    finally:
        for entry in sorted(root.iterdir()):
            if (entry / "postmaster.pid").exists():
                # Whatever state a fault left it in; a server that is gone already is fine.
                with contextlib.suppress(RuntimeError, subprocess.SubprocessError):
                    Cluster(root, entry.name).stop("immediate")
        shutil.rmtree(root, ignore_errors=True)
