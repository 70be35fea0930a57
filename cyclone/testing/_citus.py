"""Throwaway Citus clusters on this machine, for the test suite and the benchmarks.

A cluster is a coordinator and worker nodes, each a temporary ``initdb`` cluster (see
:mod:`cyclone.testing._postgres`) with Citus preloaded, on a port of its own, deleted on exit.
Citus must be installed into the PostgreSQL whose ``initdb`` is used (Debian has no package
for it; it builds from source). A database becomes distributed with :func:`form_database`:
created on every node with the ``citus`` extension, the workers registered with the
coordinator. Citus reaches a worker's database of the same name.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import asyncpg

from cyclone.testing._postgres import (
    _BASE_SETTINGS,
    _FAST_SETTINGS,
    PostgresServer,
    _cluster,
    find_bindir,
)

CITUS_SETTINGS = {
    "shared_preload_libraries": "citus",
    "max_prepared_transactions": "200",  # Citus commits a multi-node write in two phases
    # Node-to-node connections in the clear: a server run as root's delegate keeps root's HOME,
    # whose ~/.postgresql libpq would otherwise try to read for a client certificate.
    "citus.node_conninfo": "sslmode=disable",
    # A transaction prepared on a node that went away is settled soon after it returns.
    "citus.recover_2pc_interval": "1s",
}
"""What every node runs with, whatever else it is tuned for."""


def citus_library() -> Path:
    """Where Citus's shared library must be, for the PostgreSQL whose ``initdb`` is used."""
    return find_bindir().parent / "lib" / "citus.so"


def citus_missing() -> str | None:
    """Why no Citus cluster can start here, or None."""
    try:
        library = citus_library()
    except FileNotFoundError as exc:
        return f"no PostgreSQL server binaries: {exc}"
    if not library.exists():
        return f"Citus is not installed ({library} is missing): build and install it first"
    return None


@dataclass(frozen=True)
class CitusCluster:
    """A running coordinator and its worker nodes."""

    coordinator: PostgresServer
    workers: tuple[PostgresServer, ...]

    @property
    def nodes(self) -> tuple[PostgresServer, ...]:
        """The coordinator, then the workers."""
        return (self.coordinator, *self.workers)


@contextlib.contextmanager
def citus_cluster(
    workers: int = 2, *, durable: bool = False, settings: Mapping[str, str] | None = None
) -> Iterator[CitusCluster]:
    """Start a coordinator and ``workers`` worker nodes; stop and delete them on exit.

    ``durable=True`` keeps PostgreSQL's crash-safety defaults, as a benchmark wants;
    ``settings`` are added to every node's.
    """
    bindir = find_bindir()
    settings = {
        **_BASE_SETTINGS,
        "max_connections": "300",
        **({} if durable else _FAST_SETTINGS),
        **CITUS_SETTINGS,
        **(settings or {}),
    }
    with contextlib.ExitStack() as stack:
        nodes = [
            stack.enter_context(_cluster(bindir, settings, "citus", relocatable=False))
            for _ in range(workers + 1)
        ]
        yield CitusCluster(nodes[0], tuple(nodes[1:]))


def dsn_for(dsn: str, database: str) -> str:
    """``dsn`` with its database replaced by ``database``."""
    return urlunsplit(urlsplit(dsn)._replace(path=f"/{database}"))


async def execute(dsn: str, sql: str, *args: object) -> None:
    """Run one statement on a connection of its own."""
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(sql, *args)
    finally:
        await conn.close()


async def form_database(coordinator: str, workers: Sequence[str], name: str) -> None:
    """Create database ``name`` on a coordinator and its worker nodes (given by their
    maintenance databases' DSNs), each with the ``citus`` extension, and register the workers
    with the coordinator: the database is a Citus cluster of its own."""
    if not re.fullmatch(r"[a-z_][a-z0-9_]*", name):
        raise ValueError(f"database name {name!r}: use lower-case letters, digits and _")
    for dsn in (coordinator, *workers):
        await execute(dsn, f'CREATE DATABASE "{name}"')
        await execute(dsn_for(dsn, name), "CREATE EXTENSION citus")
    conn = await asyncpg.connect(dsn_for(coordinator, name))
    try:
        port = urlsplit(coordinator).port
        await conn.execute("SELECT citus_set_coordinator_host('127.0.0.1', $1)", port)
        for worker in workers:
            await conn.execute("SELECT citus_add_node('127.0.0.1', $1)", urlsplit(worker).port)
    finally:
        await conn.close()
