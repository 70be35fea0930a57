"""Debounced and throttled enqueues (``sql/debounce.sql``)."""

from __future__ import annotations

import datetime as dt
import uuid
from dataclasses import dataclass

from cyclone._storage.loader import Queries
from cyclone._storage.queries.conn import Conn, Record, fetchrow, fetchval


@dataclass(frozen=True, slots=True)
class GatedJob:
    """What a debounced or throttled job writes when it makes a run (``input``: its JSON
    text; ``group``: its group key, or None)."""

    id: uuid.UUID
    input: str
    kind: str
    queue: str
    priority: int
    max_attempts: int
    deadline: dt.datetime | None
    trace: str | None
    group: str | None

    def params(self) -> dict[str, object]:
        """The statements' parameters for these values."""
        return {
            "id": self.id,
            "input": self.input,
            "kind": self.kind,
            "queue": self.queue,
            "priority": self.priority,
            "max_attempts": self.max_attempts,
            "deadline": self.deadline,
            "trace": self.trace,
            "group_key": self.group,
        }


async def job_debounce(
    conn: Conn,
    q: Queries,
    job: GatedJob,
    *,
    key: str,
    delay: float,
    max_wait: float | None,
    push: bool,
) -> Record | None:
    """Push the key's waiting run back with ``job.input`` (only with ``push``), or make the
    job; (id, created, due), or None when an enqueue of the key inserted its run first."""
    return await fetchrow(
        conn,
        q,
        "job_debounce",
        debounce_key=key,
        delay=delay,
        max_wait=max_wait,
        push=push,
        **job.params(),
    )


async def job_debounce_find(conn: Conn, q: Queries, kind: str, key: str) -> Record | None:
    """The key's waiting run (run_id, input as JSON text), its task locked; None if none."""
    return await fetchrow(conn, q, "job_debounce_find", kind=kind, debounce_key=key)


async def job_throttle(conn: Conn, q: Queries, job: GatedJob, *, key: str, period: float) -> bool:
    """Make the job if it opens the key's period; whether it did."""
    made: int = await fetchval(
        conn, q, "job_throttle", throttle_key=key, period=period, **job.params()
    )
    return made > 0


async def job_throttle_find(conn: Conn, q: Queries, kind: str, key: str) -> uuid.UUID | None:
    """The run that opened the key's current period."""
    run_id: uuid.UUID | None = await fetchval(
        conn, q, "job_throttle_find", kind=kind, throttle_key=key
    )
    return run_id
