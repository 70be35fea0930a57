"""Reading runs and acting on them (``sql/runs.sql``): states as reported, results, listings,
what no worker serves; cancelling, ending and re-opening a job."""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Sequence
from dataclasses import dataclass

from cyclone._storage.loader import Queries
from cyclone._storage.queries.conn import Conn, Record, execute, fetch, fetchrow, fetchval


async def run_status(conn: Conn, q: Queries, run_id: uuid.UUID) -> str | None:
    """A run's state as users see it, or None if not visible."""
    state: str | None = await fetchval(conn, q, "run_status", run_id=run_id)
    return state


async def run_result(conn: Conn, q: Queries, run_id: uuid.UUID) -> Record | None:
    """A run's state, error and result output."""
    return await fetchrow(conn, q, "run_result", run_id=run_id)


async def run_payload(conn: Conn, q: Queries, run_id: uuid.UUID) -> Record | None:
    """A run's input and output as JSON text."""
    return await fetchrow(conn, q, "run_payload", run_id=run_id)


@dataclass(frozen=True)
class RunFilters:
    """What run_search and run_count match runs by, each None for any: ``cursor`` keeps
    the runs older than that one; ``states`` compares the state as reported."""

    name: str | None = None
    key: str | None = None
    created_after: dt.datetime | None = None
    created_before: dt.datetime | None = None
    cursor: uuid.UUID | None = None
    states: Sequence[str] | None = None
    queue: str | None = None


async def run_get(conn: Conn, q: Queries, run_id: uuid.UUID) -> Record | None:
    """The run ``run_id`` as listed, if visible."""
    return await fetchrow(conn, q, "run_get", run_id=run_id)


async def run_nodes(conn: Conn, q: Queries, run_id: uuid.UUID) -> list[Record]:
    """Per-node states of a run."""
    return await fetch(conn, q, "run_nodes", run_id=run_id)


async def run_edges(conn: Conn, q: Queries, run_id: uuid.UUID) -> list[Record]:
    """A workflow run's dependency edges."""
    return await fetch(conn, q, "run_edges", run_id=run_id)


async def run_kind(conn: Conn, q: Queries, run_id: uuid.UUID) -> Record | None:
    """Whether a run is a job, and its stored state."""
    return await fetchrow(conn, q, "run_kind", run_id=run_id)


async def run_unique_holder(conn: Conn, q: Queries, run_id: uuid.UUID) -> Record:
    """The run's unique key and the active run now holding it."""
    row = await fetchrow(conn, q, "run_unique_holder", run_id=run_id)
    assert row is not None
    return row


async def run_unserved(conn: Conn, q: Queries, run_id: uuid.UUID) -> list[Record]:
    """A run's claimable tasks that no live worker serves: (node, kind, queue)."""
    return await fetch(conn, q, "run_unserved", run_id=run_id)


async def stats_queues(conn: Conn, q: Queries) -> list[Record]:
    """Per-queue counts by state, oldest wait, last minute's completions and live workers."""
    return await fetch(conn, q, "stats_queues")


async def stats_unserved(conn: Conn, q: Queries) -> list[Record]:
    """Claimable tasks no live worker serves: (queue, kind, workflow, count)."""
    return await fetch(conn, q, "stats_unserved")


async def run_cancel(conn: Conn, q: Queries, run_id: uuid.UUID) -> bool:
    """Cancel a pending or failed run; whether this call cancelled it."""
    return bool(await fetchval(conn, q, "run_cancel", run_id=run_id))


async def job_lock(conn: Conn, q: Queries, run_id: uuid.UUID) -> None:
    """Lock a job's tasks, then its run, before deciding on its state."""
    await execute(conn, q, "job_lock", run_id=run_id)


async def job_end(conn: Conn, q: Queries, run_id: uuid.UUID, state: str, error: str | None) -> bool:
    """End a job as cancelled or failed; whether this call ended it."""
    ended = await fetchval(conn, q, "job_end", run_id=run_id, state=state, error=error)
    return ended is not None


async def job_reopen(conn: Conn, q: Queries, run_id: uuid.UUID) -> str | None:
    """Re-open a failed job; its queue if it re-opened."""
    queue: str | None = await fetchval(conn, q, "job_reopen", run_id=run_id)
    return queue
