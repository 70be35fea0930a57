"""The insert path's statements (``sql/insert.sql``): jobs, workflow runs, wakeups."""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Sequence

from cyclone._storage.loader import Queries
from cyclone._storage.queries.conn import Conn, Record, execute, fetchrow, fetchval


async def sequence_lock(conn: Conn, q: Queries, kind: str, sequence: str) -> None:
    """Take the sequence's enqueue lock until the transaction ends."""
    await execute(conn, q, "sequence_lock", kind=kind, sequence=sequence)


async def job_insert_many(
    conn: Conn,
    q: Queries,
    *,
    ids: Sequence[uuid.UUID],
    inputs: str,
    kind: str,
    queue: str,
    priority: int,
    process_at: dt.datetime | None,
    max_attempts: int,
    sequence: str | None,
    unique: str | None,
    deadline: dt.datetime | None,
    trace: str | None,
    notify: tuple[str, str] | None = None,
    group: str | None = None,
    expires_at: dt.datetime | None = None,
) -> int:
    """Insert standalone jobs; return how many were inserted (0: a unique key was held).

    ``inputs`` is one JSON array text, an element per id. A unique key goes with exactly one
    job. ``notify`` (channel, payload) is sent by the same statement, so only when the
    statement commits on its own (autocommit). ``group``: the jobs' group key (flow control).
    ``expires_at``: when the jobs expire if they have not started.
    """
    channel, payload = notify or (None, None)
    job: dict[str, object] = {
        "kind": kind,
        "queue": queue,
        "priority": priority,
        "process_at": process_at,
        "max_attempts": max_attempts,
        "sequence": sequence,
        "deadline": deadline,
        "trace": trace,
        "channel": channel,
        "payload": payload,
        "expires_at": expires_at,
    }
    if unique is None:
        await execute(conn, q, "job_insert_many", ids=ids, inputs=inputs, group_key=group, **job)
        return len(ids)
    one = {"id": ids[0], "inputs": inputs, "unique_key": unique, "group_key": group}
    count: int = await fetchval(conn, q, "job_insert_unique", **one, **job)
    return count


async def job_find_unique(conn: Conn, q: Queries, kind: str, unique: str) -> uuid.UUID | None:
    """The active run holding a unique key, if any."""
    run_id: uuid.UUID | None = await fetchval(
        conn, q, "job_find_unique", kind=kind, unique_key=unique
    )
    return run_id


async def workflow_insert(
    conn: Conn,
    q: Queries,
    run_id: uuid.UUID,
    name: str,
    input: str,
    result_node: str | None,
    key: str | None,
    nodes: int,
    deadline: dt.datetime | None,
    priority: int,
    process_at: dt.datetime | None,
    node_names: Sequence[str],
    node_kinds: Sequence[str | None],
    node_queues: Sequence[str],
    node_max_attempts: Sequence[int],
    node_deps: Sequence[int],
    node_wait_timeouts: Sequence[float | None],
    edge_parents: Sequence[str],
    edge_children: Sequence[str],
    trace: str | None,
    group: str | None,
    *,
    shape: tuple[Sequence[str | None], Sequence[str | None]] | None = None,
    grow_maps: bool = False,
) -> uuid.UUID | None:
    """Insert a workflow run with its nodes (one sequence per column), edges and root tasks;
    None if the key is taken. ``group``: the run's group key (flow control), or None.
    ``shape``: each node's spec and each edge's condition, for a workflow with map nodes,
    joins or branches. Its root map nodes grow their items here with ``grow_maps`` (the
    input is a non-empty list within their bounds); else the caller then expands them."""
    run: dict[str, object] = {
        "id": run_id,
        "name": name,
        "input": input,
        "result_node": result_node,
        "key": key,
        "nodes": nodes,
        "deadline": deadline,
        "priority": priority,
        "process_at": process_at,
        "node_names": node_names,
        "node_kinds": node_kinds,
        "node_queues": node_queues,
        "node_max_attempts": node_max_attempts,
        "node_deps": node_deps,
        "node_wait_timeouts": node_wait_timeouts,
        "edge_parents": edge_parents,
        "edge_children": edge_children,
        "trace": trace,
    }
    if shape is None:  # no map nodes, joins or branches: the plainer statement
        static: uuid.UUID | None = await fetchval(
            conn, q, "workflow_insert_static", group_key=group, **run
        )
        return static
    node_specs, edge_conds = shape
    inserted: uuid.UUID | None = await fetchval(
        conn,
        q,
        "workflow_insert",
        node_specs=node_specs,
        edge_conds=edge_conds,
        group_key=group,
        grow_maps=grow_maps,
        **run,
    )
    return inserted


async def workflow_find_key(
    conn: Conn, q: Queries, name: str, key: str, input: str
) -> Record | None:
    """The run holding a submit key, with whether its input equals ``input``."""
    return await fetchrow(conn, q, "workflow_find_key", name=name, key=key, input=input)


async def wakeup_notify(conn: Conn, q: Queries, channel: str, payloads: Sequence[str]) -> None:
    """Send one NOTIFY per payload."""
    await execute(conn, q, "wakeup_notify", channel=channel, payloads=payloads)
