"""Where Cyclone's tables live: a plain PostgreSQL server, or a Citus coordinator.

On a Citus cluster, Cyclone's tables are plain tables of the coordinator, beside the
application's distributed ones, and one transaction writes both. Citus commits such a
transaction in two phases when it wrote two worker nodes or more, and with one plain
``COMMIT`` sent to the node before the coordinator's own when it wrote one: a failure of the
coordinator's commit then (a serialization failure, a crash) would keep the node's rows and
lose Cyclone's. So on Citus, every transaction Cyclone writes in beside the application's
rows (a ``*_tx`` call's, a completion transaction) also makes a write of no row to
``cyclone_two_phase``, a table local to the coordinator in Citus's metadata: Citus then
prepares the nodes, and commits them only once the coordinator has committed.

:class:`Layout` learns which it is once per process, from the first connection that asks
(a worker's start-up check, a migrate, the first ``*_tx`` call), and refuses what Cyclone
cannot run on: its tables distributed or made reference tables by hand, or a worker node.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any

from cyclone._model.errors import UnsupportedLayoutError
from cyclone._storage import queries as db
from cyclone._storage.loader import Queries

logger = logging.getLogger("cyclone")

TWO_PHASE = "cyclone_two_phase"
"""The table local to the coordinator whose write of no row makes Citus prepare the nodes."""
# By Citus's partition method and replication model.
_HOW = {"h": "distributed", "nt": "a reference table", "ns": "a Citus local table"}


class Layout:
    """What this process knows of where its schema's tables live.

    ``citus`` is None until :meth:`learn` has run, then whether the schema is on a Citus
    coordinator (its caller transactions then need :meth:`mark`); ``description`` says the
    layout for a log line (None until learnt).
    """

    def __init__(self, queries: Queries) -> None:
        self.queries = queries
        self.citus: bool | None = None
        self.description: str | None = None

    async def learn(self, conn: db.Conn) -> str:
        """Read the layout on ``conn``; a description for a start-up log line.

        Raises :class:`UnsupportedLayoutError` for a layout Cyclone cannot run on.
        """
        version, node = await self._read(conn)
        if version is None or node is None:
            self.citus, self.description = False, "PostgreSQL"
        elif not node["nodes"]:
            self.citus, self.description = (
                False,
                (
                    f"Citus {version} with no nodes registered, Cyclone's tables plain: run "
                    "`cyclone migrate` again once the coordinator and its nodes are"
                ),
            )
        elif TWO_PHASE not in _names(node) and not node["migrated"]:
            # Nothing to mark yet: Cyclone's statements fail as on one server, saying to migrate.
            self.citus, self.description = None, f"Citus {version} coordinator, not migrated"
        elif TWO_PHASE not in _names(node):
            raise UnsupportedLayoutError(
                f"schema {self.queries.schema} was migrated before this database became a "
                "Citus cluster: run `cyclone migrate` again, then restart Cyclone's clients "
                "and workers"
            )
        else:
            if node["hides_shards"] and self.citus is None:
                _warn_slow_lookups()
            self.citus = True
            self.description = f"Citus {version} coordinator, Cyclone's tables local"
        return self.description

    async def refuse(self, conn: db.Conn) -> None:
        """Raise :class:`UnsupportedLayoutError` on a Citus worker node, or where Cyclone's
        tables are in Citus's metadata (what a migrate checks before any DDL)."""
        await self._read(conn)

    async def prepare(self, conn: db.Conn) -> str:
        """What a migrate does after the migrations (``conn`` in a transaction that holds
        their lock): on a Citus coordinator with nodes, make the table :meth:`mark` writes;
        then :meth:`learn`."""
        _, node = await self._read(conn)
        if node is not None and node["nodes"] and TWO_PHASE not in _names(node):
            await db.layout_two_phase_create(conn, self.queries)
        return await self.learn(conn)

    async def _read(self, conn: db.Conn) -> tuple[str | None, db.Record | None]:
        """Citus's version and what :func:`db.layout_citus_node` says (None, None without
        Citus); raises for a worker node or Cyclone's tables in Citus's metadata."""
        q = self.queries
        version = await db.layout_citus(conn, q)
        if version is None:
            return None, None
        node = await db.layout_citus_node(conn, q)
        if node["group_id"] != 0:
            raise UnsupportedLayoutError(
                f"this server is a worker node of a Citus cluster (group {node['group_id']}): "
                "connect Cyclone's clients and workers to the coordinator"
            )
        _refuse_citus_tables(q.schema, dict(entry.split(":") for entry in node["tables"]))
        return version, node

    @contextlib.asynccontextmanager
    async def marked(
        self, connection: contextlib.AbstractAsyncContextManager[Any]
    ) -> AsyncIterator[Any]:
        """``connection``'s connection, its open transaction marked by :meth:`mark`."""
        async with connection as conn:
            await self.mark(conn)
            yield conn

    async def mark(self, conn: db.Conn) -> None:
        """On a Citus coordinator, make the transaction open on ``conn`` commit in two
        phases (the module's docstring says why); nothing on plain PostgreSQL."""
        if self.citus is None:
            await self.learn(conn)
        if self.citus:
            await db.layout_two_phase(conn, self.queries)


def _warn_slow_lookups() -> None:
    logger.warning(
        "on a Citus coordinator, each new connection's first statement with an array "
        "parameter waits about 0.2 s (much longer on a busy coordinator) for asyncpg's "
        "lookup of its type, whose catalog query Citus slows by hiding its shards; Cyclone's "
        "statements use several such types, and a late heartbeat can stop a handler. Make "
        "the pool with server_settings={'citus.override_table_visibility': 'off'} (or add "
        "?citus.override_table_visibility=off to the DSN): 10 ms instead; it shows shards "
        "only to that pool's catalog queries"
    )


def _names(node: db.Record) -> set[str]:
    """The names of Cyclone's tables in Citus's metadata, from :func:`db.layout_citus_node`."""
    return {entry.split(":")[0] for entry in node["tables"]}


def _refuse_citus_tables(schema: str, tables: dict[str, str]) -> None:
    """Raise unless Cyclone's only table in Citus's metadata is :data:`TWO_PHASE`."""
    others = {name: how for name, how in tables.items() if name != TWO_PHASE}
    if not others:
        return
    said = ", ".join(
        f"{name} ({_HOW.get(how, _HOW.get(how[0], 'a Citus table'))})"
        for name, how in sorted(others.items())
    )
    undo = "; ".join(f"SELECT undistribute_table('{schema}.{name}')" for name in sorted(others))
    raise UnsupportedLayoutError(
        f"Cyclone's tables in schema {schema} must stay plain tables of the Citus "
        f"coordinator, and these are in Citus's metadata: {said}. Undo it with {undo}"
    )
