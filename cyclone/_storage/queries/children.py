"""Child runs (``sql/children.sql``): their parent link, and settling the parent's node."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from cyclone._storage.loader import Queries
from cyclone._storage.queries.conn import Conn, Record, execute, fetch


async def child_link(
    conn: Conn, q: Queries, run_id: uuid.UUID, parent_run: uuid.UUID, parent_node: str
) -> None:
    """Make ``run_id`` the child run of node ``parent_node`` of ``parent_run``."""
    await execute(
        conn, q, "child_link", run_id=run_id, parent_run=parent_run, parent_node=parent_node
    )


async def child_settle(conn: Conn, q: Queries, run_ids: Sequence[uuid.UUID]) -> list[Record]:
    """Settle the parent nodes of those runs that ended and are children (what, value,
    run_id, node of each parent node)."""
    return await fetch(conn, q, "child_settle", run_ids=run_ids)


async def run_children(conn: Conn, q: Queries, run_ids: Sequence[uuid.UUID]) -> list[uuid.UUID]:
    """The child runs of ``run_ids`` that have not ended."""
    return [r["id"] for r in await fetch(conn, q, "run_children", run_ids=run_ids)]


@dataclass(frozen=True)
class ChildRuns:
    """Child runs to write in one statement, as ``child_insert_many`` takes them: the
    columns of the runs (one element per run), of their nodes and of their edges."""

    runs: tuple[list[Any], ...]  # ids, names, inputs, result nodes, keys, node counts,
    # traces, parent runs, parent nodes
    nodes: tuple[list[Any], ...]  # runs, names, kinds, queues, max attempts, deps, timeouts
    edges: tuple[list[Any], ...]  # runs, parents, children


async def child_insert_many(conn: Conn, q: Queries, children: ChildRuns) -> list[Record]:
    """Write child runs with their nodes, edges, root tasks and parent links (what, value:
    each run written, each queue that got work)."""
    ids, names, inputs, results, keys, counts, traces, parent_runs, parent_nodes = children.runs
    node_runs, node_names, kinds, queues, attempts, deps, timeouts = children.nodes
    edge_runs, edge_parents, edge_children = children.edges
    return await fetch(
        conn,
        q,
        "child_insert_many",
        ids=ids,
        names=names,
        inputs=inputs,
        result_nodes=results,
        keys=keys,
        node_counts=counts,
        traces=traces,
        parent_runs=parent_runs,
        parent_nodes=parent_nodes,
        node_runs=node_runs,
        node_names=node_names,
        node_kinds=kinds,
        node_queues=queues,
        node_max_attempts=attempts,
        node_deps=deps,
        node_wait_timeouts=timeouts,
        edge_runs=edge_runs,
        edge_parents=edge_parents,
        edge_children=edge_children,
    )
