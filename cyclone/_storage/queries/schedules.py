"""Schedules (``sql/schedules.sql``): declared and dynamic schedules, and their firing.

A ``now`` argument, where taken, stands for the database's clock when not None (tests).
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Sequence
from dataclasses import dataclass

from cyclone._storage.loader import Queries
from cyclone._storage.queries.conn import Conn, Record, execute, fetch, fetchrow, fetchval


@dataclass(frozen=True)
class ScheduleDefinition:
    """A schedule's definition as stored: what schedule_declare_many, schedule_create and
    schedule_update write (``input`` as JSON text, ``next_at`` the first slot to fire)."""

    target: str
    job: bool
    cron: str | None
    every: dt.timedelta | None
    start_at: dt.datetime | None
    tz: str
    catch_up: str
    catch_up_window: dt.timedelta | None
    overlap: str
    input: str | None
    next_at: dt.datetime


# schedule_declare_many takes one array per field of the definitions, named here.
_ARRAYS = {
    "target": "targets",
    "job": "jobs",
    "cron": "crons",
    "every": "everys",
    "start_at": "start_ats",
    "tz": "tzs",
    "catch_up": "catch_ups",
    "catch_up_window": "windows",
    "overlap": "overlaps",
    "input": "inputs",
    "next_at": "next_ats",
}


async def schedule_declare_many(
    conn: Conn, q: Queries, lease: float, rows: Sequence[tuple[str, ScheduleDefinition]]
) -> None:
    """Upsert declared schedules, given as (name, definition) pairs."""
    arrays = {a: [getattr(d, f) for _, d in rows] for f, a in _ARRAYS.items()}
    await execute(
        conn, q, "schedule_declare_many", lease=lease, names=[n for n, _ in rows], **arrays
    )


async def schedule_refresh(conn: Conn, q: Queries, lease: float, declared: list[str]) -> None:
    """Extend the declarations of ``declared`` by ``lease`` seconds from now."""
    await execute(conn, q, "schedule_refresh", lease=lease, declared=declared)


async def schedule_next_due(
    conn: Conn, q: Queries, declared: list[str], targets: list[str], now: dt.datetime | None
) -> Record:
    """The first due schedule, deadline and wait timeout, and the database's clock."""
    row = await fetchrow(conn, q, "schedule_next_due", declared=declared, targets=targets, now=now)
    assert row is not None  # a SELECT of aggregates always returns its one row
    return row


async def schedule_claim_due(
    conn: Conn,
    q: Queries,
    declared: list[str],
    targets: list[str],
    now: dt.datetime | None,
    limit: int,
) -> list[Record]:
    """Lock the due schedules this worker fires (inside the caller's transaction)."""
    return await fetch(
        conn, q, "schedule_claim_due", now=now, declared=declared, targets=targets, limit=limit
    )


async def schedule_job_insert_many(
    conn: Conn,
    q: Queries,
    *,
    kind: str,
    queue: str,
    priority: int,
    max_attempts: int,
    ids: Sequence[uuid.UUID],
    inputs: str,
    keys: Sequence[str],
) -> list[Record]:
    """Insert keyed jobs (``inputs`` one JSON array text, an element per key); returns
    (id, key) of those inserted (a taken key inserts nothing)."""
    return await fetch(
        conn,
        q,
        "schedule_job_insert_many",
        kind=kind,
        queue=queue,
        priority=priority,
        max_attempts=max_attempts,
        ids=ids,
        inputs=inputs,
        keys=keys,
    )


async def schedule_advance(
    conn: Conn,
    q: Queries,
    name: str,
    *,
    next_at: dt.datetime,
    last_slot: dt.datetime | None,
    last_run_id: uuid.UUID | None,
    triggered_at: dt.datetime | None,
) -> None:
    """Record a firing pass of ``name``."""
    await execute(
        conn,
        q,
        "schedule_advance",
        name=name,
        next_at=next_at,
        last_slot=last_slot,
        last_run_id=last_run_id,
        triggered_at=triggered_at,
    )


async def schedule_list(conn: Conn, q: Queries, name: str | None) -> list[Record]:
    """Every stored schedule (or the one named), by name."""
    return await fetch(conn, q, "schedule_list", name=name)


async def schedule_lock(conn: Conn, q: Queries, name: str) -> Record | None:
    """Lock one schedule's row for a change; None if there is none."""
    return await fetchrow(conn, q, "schedule_lock", name=name)


async def schedule_set_paused(
    conn: Conn, q: Queries, name: str, paused: bool, next_at: dt.datetime | None
) -> None:
    """Pause or resume ``name`` (resuming at ``next_at``)."""
    await execute(conn, q, "schedule_set_paused", name=name, paused=paused, next_at=next_at)


async def schedule_trigger(conn: Conn, q: Queries, name: str) -> dt.datetime | None:
    """Ask for a run of ``name`` now; the trigger's time, or None without such a schedule."""
    at: dt.datetime | None = await fetchval(conn, q, "schedule_trigger", name=name)
    return at


async def schedule_create(
    conn: Conn, q: Queries, name: str, definition: ScheduleDefinition
) -> bool:
    """Insert a dynamic schedule; False when the name is taken."""
    created = await fetchval(conn, q, "schedule_create", name=name, **vars(definition))
    return created is not None


async def schedule_update(
    conn: Conn, q: Queries, name: str, definition: ScheduleDefinition
) -> None:
    """Replace a dynamic schedule's definition (locked by the caller)."""
    await execute(conn, q, "schedule_update", name=name, **vars(definition))


async def schedule_delete(conn: Conn, q: Queries, name: str) -> None:
    """Delete one schedule (locked by the caller)."""
    await execute(conn, q, "schedule_delete", name=name)
