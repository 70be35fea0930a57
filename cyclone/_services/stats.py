"""The read models of live work: each queue's counts and flow control, the live workers, and
what ended per minute (``client.stats()``, ``client.workers()``, ``client.throughput()``, for
``cyclone stats`` and the dashboard)."""

from __future__ import annotations

from cyclone._model.errors import InvalidInputError
from cyclone._model.options import validate_int
from cyclone._model.stats import QueueStats, Throughput, UnservedWork, WorkerInfo
from cyclone._services.database import Database
from cyclone._services.queues import flow_fields
from cyclone._storage import queries as db

THROUGHPUT_MAX_MINUTES = 24 * 60


async def queues(database: Database) -> list[QueueStats]:
    """Live work per queue, with the work no live worker serves and each queue's flow
    control; paused or limited queues without work or workers are listed too."""
    q = database.queries
    async with database.acquire() as conn:
        rows = await db.stats_queues(conn, q)
        unserved = await db.stats_unserved(conn, q)
        flow = {r["queue"]: r for r in await db.queue_list(conn, q, None)}
    work: dict[str, list[UnservedWork]] = {}
    for u in unserved:
        work.setdefault(u["queue"], []).append(
            UnservedWork(kind=u["kind"], workflow=u["workflow"], count=u["count"])
        )
    found = [
        QueueStats(
            **dict(r),
            unserved=sum(w.count for w in work.get(r["queue"], ())),
            unserved_work=work.get(r["queue"], []),
            **flow_fields(flow.pop(r["queue"], None)),
        )
        for r in rows
    ]
    idle = [QueueStats(q, 0, 0, 0, 0, 0, None, 0, **flow_fields(f)) for q, f in flow.items()]
    return sorted(found + idle, key=lambda s: s.queue)


async def workers(database: Database) -> list[WorkerInfo]:
    """The live workers, newest first."""
    async with database.acquire() as conn:
        rows = await db.worker_list(conn, database.queries)
    return [WorkerInfo(**dict(r)) for r in rows]


async def throughput(database: Database, minutes: int) -> list[Throughput]:
    """What ended per queue and minute over the last ``minutes`` (at most a day)."""
    window = validate_int(minutes, what="minutes", low=1)
    if window > THROUGHPUT_MAX_MINUTES:
        raise InvalidInputError(
            f"minutes must be at most {THROUGHPUT_MAX_MINUTES} (one day), got {window}"
        )
    async with database.acquire() as conn:
        rows = await db.throughput_minutes(conn, database.queries, window)
    return [Throughput(**dict(r)) for r in rows]
