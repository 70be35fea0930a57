"""Sealed payloads (``sql/keys.sql``): values per key id, and the picks and rewrites of a
rotation to the current key. A pick and its write run in one transaction of the caller's."""

from __future__ import annotations

import uuid
from collections.abc import Sequence

from cyclone._storage.loader import Queries
from cyclone._storage.queries.conn import Conn, Record, execute, fetch


async def sealed_count(conn: Conn, q: Queries) -> list[Record]:
    """``(key_id, n)``: how many stored values each key id seals."""
    return await fetch(conn, q, "sealed_count")


async def run_sealed_pick(
    conn: Conn, q: Queries, current: str, after: str, batch: int
) -> list[Record]:
    """Lock up to ``batch`` runs past the ctid ``after`` holding a value of another key."""
    return await fetch(conn, q, "run_sealed_pick", current=current, after=after, batch=batch)


async def run_sealed_write(
    conn: Conn, q: Queries, ids: Sequence[uuid.UUID], columns: Sequence[Sequence[str | None]]
) -> None:
    """Write the picked runs' ``columns`` (inputs, outputs, errors, error lists)."""
    inputs, outputs, errors, error_lists = columns
    await execute(
        conn,
        q,
        "run_sealed_write",
        ids=ids,
        inputs=inputs,
        outputs=outputs,
        errors=errors,
        error_lists=error_lists,
    )


async def step_sealed_pick(
    conn: Conn, q: Queries, current: str, after: str, batch: int
) -> list[Record]:
    """Lock up to ``batch`` nodes past the ctid ``after`` holding a value of another key."""
    return await fetch(conn, q, "step_sealed_pick", current=current, after=after, batch=batch)


async def step_sealed_write(
    conn: Conn,
    q: Queries,
    keys: tuple[Sequence[uuid.UUID], Sequence[str]],
    columns: Sequence[Sequence[str | None]],
) -> None:
    """Write the picked nodes' (by run id and node) ``columns`` (inputs, outputs, signals,
    errors)."""
    inputs, outputs, signals, errors = columns
    await execute(
        conn,
        q,
        "step_sealed_write",
        run_ids=keys[0],
        nodes=keys[1],
        inputs=inputs,
        outputs=outputs,
        signals=signals,
        errors=errors,
    )


async def task_sealed_pick(
    conn: Conn, q: Queries, current: str, after: str, batch: int
) -> list[Record]:
    """Lock up to ``batch`` tasks past the ctid ``after`` holding a value of another key."""
    return await fetch(conn, q, "task_sealed_pick", current=current, after=after, batch=batch)


async def task_sealed_write(
    conn: Conn,
    q: Queries,
    keys: tuple[Sequence[uuid.UUID], Sequence[int]],
    columns: Sequence[Sequence[str | None]],
) -> None:
    """Write the picked tasks' (by run id and id) ``columns`` (inputs, errors)."""
    inputs, errors = columns
    await execute(
        conn, q, "task_sealed_write", run_ids=keys[0], ids=keys[1], inputs=inputs, errors=errors
    )


async def schedule_sealed_pick(
    conn: Conn, q: Queries, current: str, after: str, batch: int
) -> list[Record]:
    """Lock up to ``batch`` schedules past the ctid ``after`` whose input has another key."""
    return await fetch(conn, q, "schedule_sealed_pick", current=current, after=after, batch=batch)


async def schedule_sealed_write(
    conn: Conn, q: Queries, names: Sequence[str], columns: Sequence[Sequence[str | None]]
) -> None:
    """Write the picked schedules' ``columns`` (inputs)."""
    (inputs,) = columns
    await execute(conn, q, "schedule_sealed_write", names=names, inputs=inputs)
