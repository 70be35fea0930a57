"""The only module that sends SQL at run time: one typed function per named query.

Each function takes the connection to run on and the client's :class:`~cyclone._sql.Queries`.
Whether that connection is the caller's transaction, a completion transaction or a pooled
connection of Cyclone's own is the caller's business; nothing here begins or commits.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Sequence
from typing import Any, Literal

import asyncpg

from cyclone._sql import Queries

Conn = asyncpg.Connection | asyncpg.pool.PoolConnectionProxy
Record = asyncpg.Record

# What a statement raises when the server or the connection fails under it, rather than for
# what the statement asked: a background loop logs these and carries on.
DATABASE_ERRORS = (
    OSError,
    asyncpg.PostgresError,
    asyncpg.InterfaceError,
    asyncpg.InternalClientError,
)
# Of those, the failures after which sending the statement again is safe: the connection
# went away (the transaction may or may not have committed: every outcome write is fenced,
# so a second try cannot apply twice) or a deadlock aborted it.
RETRYABLE_ERRORS = (
    OSError,
    asyncpg.PostgresConnectionError,
    asyncpg.InterfaceError,
    asyncpg.InternalClientError,
    asyncpg.DeadlockDetectedError,
    asyncpg.exceptions.OperatorInterventionError,
    # The server refused a new connection for now ("too many clients"): it can take one later.
    asyncpg.TooManyConnectionsError,
)


class ClaimedRows(list[Record]):
    """The tasks a claim took, and whether a limit held it back (``held``). If so,
    ``retry_in`` is how many seconds until a claim can start more: 0 at once, ``None`` when
    a running task of the queue (or kind) ends."""

    held: bool = False
    retry_in: float | None = None


async def migrations_apply(conn: Conn, q: Queries) -> list[int]:
    """Apply the migrations this schema lacks, under a lock; return the versions applied."""
    await conn.execute(q["migrations_lock"], q.schema)
    await conn.execute(q["schema_create"])
    await conn.execute(q["migrations_table"])
    applied = {r["version"] for r in await conn.fetch(q["migrations_applied"])}
    done = []
    for migration in q.migrations:
        if migration.version in applied:
            continue
        await conn.execute(migration.sql)
        await conn.execute(q["migrations_record"], migration.version, migration.name)
        done.append(migration.version)
    return done


async def migrations_applied(conn: Conn, q: Queries) -> list[int]:
    """Versions recorded in the migrations table."""
    return [r["version"] for r in await conn.fetch(q["migrations_applied"])]


async def sequence_lock(conn: Conn, q: Queries, kind: str, sequence: str) -> None:
    """Take the sequence's enqueue lock until the transaction ends."""
    await conn.execute(q["sequence_lock"], kind, sequence)


async def job_insert_many(
    conn: Conn,
    q: Queries,
    *,
    ids: Sequence[uuid.UUID],
    inputs: Sequence[str],
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
) -> int:
    """Insert standalone jobs; return how many were inserted (0: a unique key was held).

    A unique key goes with exactly one job. ``notify`` (channel, payload) is sent by the same
    statement, so only when the statement commits on its own (autocommit). ``group``: the
    jobs' group key (flow control).
    """
    channel, payload = notify or (None, None)
    rest = (kind, queue, priority, process_at, max_attempts, sequence, deadline, trace)
    # Work with no group key goes through statements that write no column of migration 0008.
    grouped = () if group is None else (group,)
    suffix = "" if group is None else "_grouped"
    if unique is None:
        await conn.execute(
            q["job_insert_many" + suffix], ids, inputs, *rest, channel, payload, *grouped
        )
        return len(ids)
    count: int = await conn.fetchval(
        q["job_insert_unique" + suffix],
        ids[0],
        inputs[0],
        *rest,
        channel,
        payload,
        unique,
        *grouped,
    )
    return count


async def job_find_unique(conn: Conn, q: Queries, kind: str, unique: str) -> uuid.UUID | None:
    """The active run holding a unique key, if any."""
    run_id: uuid.UUID | None = await conn.fetchval(q["job_find_unique"], kind, unique)
    return run_id


async def workflow_insert(conn: Conn, q: Queries, *args: Any) -> uuid.UUID | None:
    """Insert a workflow run with steps, edges and root tasks; None if the key is taken.
    The last argument is the group key (flow control), or None for none."""
    *rest, group = args
    if group is None:
        run_id: uuid.UUID | None = await conn.fetchval(q["workflow_insert"], *rest)
    else:
        run_id = await conn.fetchval(q["workflow_insert_grouped"], *rest, group)
    return run_id


async def workflow_find_key(
    conn: Conn, q: Queries, name: str, key: str, input: str
) -> Record | None:
    """The run holding a submit key, with whether its input equals ``input``."""
    return await conn.fetchrow(q["workflow_find_key"], name, key, input)


async def task_claim(
    conn: Conn,
    q: Queries,
    queue: str,
    kinds: Sequence[str],
    limit: int,
    lease: float,
    worker: str,
    workflows: Sequence[str],
) -> ClaimedRows:
    """Claim up to ``limit`` available tasks of ``queue`` (nodes only of ``workflows``).

    Within the queue's flow control: the rows are the claimed tasks; when a limit held the
    claim back, ``retry_in`` on the result says when to claim again (see ClaimedRows).
    """
    rows = await conn.fetch(q["task_claim"], queue, kinds, limit, lease, worker, workflows)
    claimed = ClaimedRows(r for r in rows if r["id"] is not None)
    for r in rows:
        if r["id"] is None:  # the statement's last row, if a limit held the claim back
            claimed.held, claimed.retry_in = True, r["retry_in"]
    return claimed


async def task_heartbeat(
    conn: Conn,
    q: Queries,
    run_ids: Sequence[uuid.UUID],
    ids: Sequence[int],
    claims: Sequence[int],
    lease: float,
) -> set[tuple[int, int]]:
    """Extend leases; return the (id, claims) still owned."""
    rows = await conn.fetch(q["task_heartbeat"], run_ids, ids, claims, lease)
    return {(r["id"], r["claims"]) for r in rows}


async def task_pending_work(
    conn: Conn, q: Queries, kinds: Sequence[str], workflows: Sequence[str]
) -> bool:
    """Whether a worker of ``kinds`` and ``workflows`` has work claimable now or running."""
    return bool(await conn.fetchval(q["task_pending_work"], kinds, workflows))


async def run_lock_many(
    conn: Conn, q: Queries, run_ids: Sequence[uuid.UUID]
) -> dict[uuid.UUID, str]:
    """Lock runs in id order (the first lock of every multi-row transition)."""
    rows = await conn.fetch(q["run_lock_many"], sorted(set(run_ids)))
    return {r["id"]: r["state"] for r in rows}


async def job_complete_many(
    conn: Conn,
    q: Queries,
    run_ids: Sequence[uuid.UUID],
    ids: Sequence[int],
    claims: Sequence[int],
    outputs: Sequence[str],
) -> list[Record]:
    """Complete jobs whose attempts still own their tasks; return (id, run_id) of those."""
    return await conn.fetch(q["job_complete_many"], run_ids, ids, claims, outputs)


async def node_finish_many(
    conn: Conn,
    q: Queries,
    run_ids: Sequence[uuid.UUID],
    ids: Sequence[int],
    claims: Sequence[int],
    outputs: Sequence[str],
) -> list[Record]:
    """Record completed workflow nodes whose attempts still own their tasks."""
    return await conn.fetch(q["node_finish_many"], run_ids, ids, claims, outputs)


async def attempts_completed(
    conn: Conn,
    q: Queries,
    run_ids: Sequence[uuid.UUID],
    nodes: Sequence[str | None],
    task_ids: Sequence[int],
    claims: Sequence[int],
) -> set[tuple[uuid.UUID, str | None]]:
    """The (run, node) of those attempts that completed their job or node."""
    rows = await conn.fetch(q["attempts_completed"], run_ids, nodes, task_ids, claims)
    return {(r["run_id"], r["node"]) for r in rows}


async def wait_finish_many(
    conn: Conn, q: Queries, run_ids: Sequence[uuid.UUID], nodes: Sequence[str]
) -> list[Record]:
    """Complete signalled, reachable wait nodes."""
    return await conn.fetch(q["wait_finish_many"], run_ids, nodes)


async def node_advance(
    conn: Conn, q: Queries, run_ids: Sequence[uuid.UUID], nodes: Sequence[str]
) -> list[Record]:
    """Release children of completed nodes and count their runs down."""
    return await conn.fetch(q["node_advance"], run_ids, nodes)


async def task_retry_many(
    conn: Conn,
    q: Queries,
    run_ids: Sequence[uuid.UUID],
    ids: Sequence[int],
    claims: Sequence[int],
    delays: Sequence[float],
    errors: Sequence[str | None],
    refunds: Sequence[bool],
) -> list[Record]:
    """Put attempts back to available after a delay; return (id, queue) of those owned."""
    return await conn.fetch(q["task_retry_many"], run_ids, ids, claims, delays, errors, refunds)


async def last_attempt_fail(
    conn: Conn,
    q: Queries,
    statement: Literal["job_fail", "node_fail"],
    run_id: uuid.UUID,
    task_id: int,
    claims: int,
    error: str,
    *,
    expired_only: bool,
) -> bool:
    """Fail a last attempt: of a job (whether its run failed by this call) or of a workflow
    node (whether the attempt still owned its task)."""
    row = await conn.fetchval(q[statement], run_id, task_id, claims, error, expired_only)
    return row is not None


async def attempts_released(
    conn: Conn,
    q: Queries,
    run_ids: Sequence[uuid.UUID],
    task_ids: Sequence[int],
    claims: Sequence[int],
    attempts: Sequence[int],
) -> set[tuple[int, int]]:
    """The (task, claims) of those attempts that put their task back in its queue."""
    rows = await conn.fetch(q["attempts_released"], run_ids, task_ids, claims, attempts)
    return {(r["id"], r["claims"]) for r in rows}


async def attempts_failed(
    conn: Conn,
    q: Queries,
    run_ids: Sequence[uuid.UUID],
    nodes: Sequence[str | None],
    errors: Sequence[str],
) -> set[tuple[uuid.UUID, str | None]]:
    """The (run, node) of those attempts whose failure, with that error record, was kept."""
    rows = await conn.fetch(q["attempts_failed"], run_ids, nodes, errors)
    return {(r["run_id"], r["node"]) for r in rows}


async def run_fail(
    conn: Conn, q: Queries, run_id: uuid.UUID, error: str, *, drop_running: bool
) -> None:
    """Fail a pending run and drop the work it has not started (or all of it)."""
    await conn.execute(q["run_fail"], run_id, error, drop_running)


async def wait_expire_due(conn: Conn, q: Queries, limit: int) -> list[Record]:
    """Wait nodes past their timeout."""
    return await conn.fetch(q["wait_expire_due"], limit)


async def wait_expire(conn: Conn, q: Queries, run_id: uuid.UUID, node: str, error: str) -> bool:
    """Fail a wait node past its timeout; whether it was still waiting."""
    return await conn.fetchval(q["wait_expire"], run_id, node, error) is not None


async def run_deadline_due(conn: Conn, q: Queries, limit: int) -> list[Record]:
    """Pending runs past their deadline: id, and whether each is a job."""
    return await conn.fetch(q["run_deadline_due"], limit)


async def task_reclaim(conn: Conn, q: Queries, limit: int) -> list[Record]:
    """Put tasks with expired leases and attempts left back to available."""
    return await conn.fetch(q["task_reclaim"], limit)


async def task_expired_exhausted(conn: Conn, q: Queries, limit: int) -> list[Record]:
    """Tasks whose lease expired on their last attempt."""
    return await conn.fetch(q["task_expired_exhausted"], limit)


async def run_cancel(conn: Conn, q: Queries, run_id: uuid.UUID) -> bool:
    """Cancel a pending or failed run; whether this call cancelled it."""
    return bool(await conn.fetchval(q["run_cancel"], run_id))


async def job_lock(conn: Conn, q: Queries, run_id: uuid.UUID) -> None:
    """Lock a job's tasks, then its run, before deciding on its state."""
    await conn.execute(q["job_lock"], run_id)


async def job_end(conn: Conn, q: Queries, run_id: uuid.UUID, state: str, error: str | None) -> bool:
    """End a job as cancelled or failed; whether this call ended it."""
    return await conn.fetchval(q["job_end"], run_id, state, error) is not None


async def run_unique_holder(conn: Conn, q: Queries, run_id: uuid.UUID) -> Record:
    """The run's unique key and the active run now holding it."""
    row = await conn.fetchrow(q["run_unique_holder"], run_id)
    assert row is not None
    return row


async def run_kind(conn: Conn, q: Queries, run_id: uuid.UUID) -> Record | None:
    """Whether a run is a job, and its stored state."""
    return await conn.fetchrow(q["run_kind"], run_id)


async def run_reopen(conn: Conn, q: Queries, run_id: uuid.UUID, node: str | None) -> Record:
    """Reset a failed workflow run's failed nodes: how many, and whether the run re-opened."""
    row = await conn.fetchrow(q["run_reopen"], run_id, node)
    assert row is not None
    return row


async def job_reopen(conn: Conn, q: Queries, run_id: uuid.UUID) -> str | None:
    """Re-open a failed job; its queue if it re-opened."""
    queue: str | None = await conn.fetchval(q["job_reopen"], run_id)
    return queue


async def run_release(conn: Conn, q: Queries, run_id: uuid.UUID) -> list[Record]:
    """Queue the ready nodes of an open run."""
    return await conn.fetch(q["run_release"], run_id)


async def wait_signal(
    conn: Conn, q: Queries, run_id: uuid.UUID, node: str, payload: str
) -> str | None:
    """Store a wait node's signal; the node's state, or None if nothing was stored."""
    state: str | None = await conn.fetchval(q["wait_signal"], run_id, node, payload)
    return state


async def step_get(conn: Conn, q: Queries, run_id: uuid.UUID, node: str) -> Record | None:
    """A node's kind and whether it was signalled."""
    return await conn.fetchrow(q["step_get"], run_id, node)


async def run_status(conn: Conn, q: Queries, run_id: uuid.UUID) -> str | None:
    """A run's state as users see it, or None if not visible."""
    state: str | None = await conn.fetchval(q["run_status"], run_id)
    return state


async def run_result(conn: Conn, q: Queries, run_id: uuid.UUID) -> Record | None:
    """A run's state, error and result output."""
    return await conn.fetchrow(q["run_result"], run_id)


async def run_payload(conn: Conn, q: Queries, run_id: uuid.UUID) -> Record | None:
    """A run's input and output as JSON text."""
    return await conn.fetchrow(q["run_payload"], run_id)


async def run_list(conn: Conn, q: Queries, *args: Any) -> list[Record]:
    """Runs matching the filters, newest first."""
    return await conn.fetch(q["run_list"], *args)


async def run_nodes(conn: Conn, q: Queries, run_id: uuid.UUID) -> list[Record]:
    """Per-node states of a run."""
    return await conn.fetch(q["run_nodes"], run_id)


async def run_purge(
    conn: Conn, q: Queries, before: dt.datetime, states: Sequence[str], limit: int
) -> int:
    """Delete up to ``limit`` terminal runs; return how many."""
    count: int = await conn.fetchval(q["run_purge"], before, states, limit)
    return count


async def run_edges(conn: Conn, q: Queries, run_id: uuid.UUID) -> list[Record]:
    """A workflow run's dependency edges."""
    return await conn.fetch(q["run_edges"], run_id)


async def stats_queues(conn: Conn, q: Queries) -> list[Record]:
    """Per-queue counts by state, oldest wait, last minute's completions and live workers."""
    return await conn.fetch(q["stats_queues"])


async def stats_unserved(conn: Conn, q: Queries) -> list[Record]:
    """Claimable tasks no live worker serves: (queue, kind, workflow, count)."""
    return await conn.fetch(q["stats_unserved"])


async def run_unserved(conn: Conn, q: Queries, run_id: uuid.UUID) -> list[Record]:
    """A run's claimable tasks that no live worker serves: (node, kind, queue)."""
    return await conn.fetch(q["run_unserved"], run_id)


async def worker_present(
    conn: Conn,
    q: Queries,
    worker: str,
    host: str,
    pid: int,
    queues: Sequence[str],
    kinds: Sequence[str],
    workflows: Sequence[str],
    ttl: float,
) -> None:
    """Record ``worker`` as live for ``ttl`` seconds with what it claims; sweep expired rows."""
    await conn.execute(q["worker_present"], worker, host, pid, queues, kinds, workflows, ttl)


async def worker_leave(conn: Conn, q: Queries, worker: str) -> None:
    """Remove ``worker``'s presence row."""
    await conn.execute(q["worker_leave"], worker)


async def worker_list(conn: Conn, q: Queries) -> list[Record]:
    """The live workers' presence rows, newest first."""
    return await conn.fetch(q["worker_list"])


async def wakeup_notify(conn: Conn, q: Queries, channel: str, payloads: Sequence[str]) -> None:
    """Send one NOTIFY per payload."""
    await conn.execute(q["wakeup_notify"], channel, payloads)


# The dashboard's read models (sql/dashboard.sql).


async def run_search(conn: Conn, q: Queries, *args: Any) -> list[Record]:
    """One page of runs matching the filters, newest first, within a bounded walk."""
    return await conn.fetch(q["run_search"], *args)


async def run_walk_end(
    conn: Conn, q: Queries, cursor: uuid.UUID | None, scan: int
) -> uuid.UUID | None:
    """The last run a walk of ``scan`` runs from ``cursor`` reads; None if fewer are left."""
    found: uuid.UUID | None = await conn.fetchval(q["run_walk_end"], cursor, scan)
    return found


async def run_count(conn: Conn, q: Queries, *args: Any) -> int:
    """How many runs match the filters, counting up to a cap."""
    count: int = await conn.fetchval(q["run_count"], *args)
    return count


async def run_payloads(conn: Conn, q: Queries, run_id: uuid.UUID) -> Record | None:
    """A run's input and output as JSON text."""
    return await conn.fetchrow(q["run_payloads"], run_id)


async def node_payloads(conn: Conn, q: Queries, run_id: uuid.UUID) -> list[Record]:
    """Each node's queue, output and signal payload."""
    return await conn.fetch(q["node_payloads"], run_id)


async def throughput_minutes(conn: Conn, q: Queries, minutes: int) -> list[Record]:
    """Completed and failed steps per queue and minute over the last ``minutes``."""
    return await conn.fetch(q["throughput_minutes"], minutes)


# Schedules (cyclone/sql/schedules.sql): declared and dynamic schedules, and their firing.


async def schedule_declare_many(
    conn: Conn, q: Queries, lease: float, rows: list[tuple[Any, ...]]
) -> None:
    """Upsert declared schedules; ``rows`` are (name, target, job, cron, every, start, tz,
    catch_up, window, overlap, input, next_at) tuples."""
    columns = [list(c) for c in zip(*rows, strict=True)] if rows else [[] for _ in range(12)]
    await conn.execute(q["schedule_declare_many"], lease, *columns)


async def schedule_refresh(conn: Conn, q: Queries, lease: float, declared: list[str]) -> None:
    """Extend the declarations of ``declared`` by ``lease`` seconds from now."""
    await conn.execute(q["schedule_refresh"], lease, declared)


async def schedule_next_due(
    conn: Conn, q: Queries, declared: list[str], targets: list[str], now: dt.datetime | None
) -> Record:
    """The first due schedule, deadline and wait timeout, and the database's clock."""
    row: Record | None = await conn.fetchrow(q["schedule_next_due"], declared, targets, now)
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
    return await conn.fetch(q["schedule_claim_due"], now, declared, targets, limit)


async def schedule_job_insert_many(
    conn: Conn,
    q: Queries,
    *,
    kind: str,
    queue: str,
    priority: int,
    max_attempts: int,
    ids: Sequence[uuid.UUID],
    inputs: Sequence[str],
    keys: Sequence[str],
) -> list[Record]:
    """Insert keyed jobs; returns (id, key) of those inserted (a taken key inserts nothing)."""
    return await conn.fetch(
        q["schedule_job_insert_many"], kind, queue, priority, max_attempts, ids, inputs, keys
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
    await conn.execute(q["schedule_advance"], next_at, last_slot, last_run_id, triggered_at, name)


async def schedule_list(conn: Conn, q: Queries, name: str | None) -> list[Record]:
    """Every stored schedule (or the one named), by name."""
    return await conn.fetch(q["schedule_list"], name)


async def schedule_lock(conn: Conn, q: Queries, name: str) -> Record | None:
    """Lock one schedule's row for a change; None if there is none."""
    row: Record | None = await conn.fetchrow(q["schedule_lock"], name)
    return row


async def schedule_set_paused(
    conn: Conn, q: Queries, name: str, paused: bool, next_at: dt.datetime | None
) -> None:
    """Pause or resume ``name`` (resuming at ``next_at``)."""
    await conn.execute(q["schedule_set_paused"], paused, next_at, name)


async def schedule_trigger(conn: Conn, q: Queries, name: str) -> dt.datetime | None:
    """Ask for a run of ``name`` now; the trigger's time, or None without such a schedule."""
    at: dt.datetime | None = await conn.fetchval(q["schedule_trigger"], name)
    return at


async def schedule_create(conn: Conn, q: Queries, *args: Any) -> bool:
    """Insert a dynamic schedule; False when the name is taken."""
    return await conn.fetchval(q["schedule_create"], *args) is not None


async def schedule_update(conn: Conn, q: Queries, *args: Any) -> None:
    """Replace a dynamic schedule's definition (locked by the caller)."""
    await conn.execute(q["schedule_update"], *args)


async def schedule_delete(conn: Conn, q: Queries, name: str) -> None:
    """Delete one schedule (locked by the caller)."""
    await conn.execute(q["schedule_delete"], name)


async def server_backend_pid(conn: Conn, q: Queries, *, prepared_as: str | None = None) -> int:
    """The pid of the backend that runs this statement; ``prepared_as``: run it as a named
    prepared statement of that name, left on the server (a pooler probe's evidence)."""
    if prepared_as is None:
        pid: int = await conn.fetchval(q["server_backend_pid"])
        return pid
    statement = await conn.prepare(q["server_backend_pid"], name=prepared_as)
    pid = await statement.fetchval()
    return pid


async def server_statement_exists(conn: Conn, q: Queries, name: str) -> bool:
    """Whether the backend running this statement holds a prepared statement ``name``."""
    found: bool = await conn.fetchval(q["server_statement_exists"], name)
    return found


# Flow control (cyclone/sql/flow.sql): paused queues and limits, set by operators.


async def queue_limits_set(
    conn: Conn,
    q: Queries,
    queue: str,
    concurrency: int | None,
    rate: int | None,
    per: float | None,
    key_concurrency: int | None,
    key_rate: int | None,
    key_per: float | None,
) -> None:
    """Replace a queue's limits (NULL: none)."""
    await conn.execute(
        q["queue_limits_set"], queue, concurrency, rate, per, key_concurrency, key_rate, key_per
    )


async def queue_pause_set(conn: Conn, q: Queries, queue: str, paused: bool) -> bool:
    """Pause or resume a queue; whether it was paused before."""
    was: bool = await conn.fetchval(q["queue_pause_set"], queue, paused)
    return was


async def queue_list(conn: Conn, q: Queries, queue: str | None) -> list[Record]:
    """Queues with a setting (or the one named), by name."""
    return await conn.fetch(q["queue_list"], queue)


async def queue_known(conn: Conn, q: Queries, queue: str) -> bool:
    """Whether ``queue`` has a setting or a live worker claims from it."""
    return bool(await conn.fetchval(q["queue_known"], queue))


async def kind_limits_set(
    conn: Conn, q: Queries, kind: str, concurrency: int | None, rate: int | None, per: float | None
) -> None:
    """Replace a kind's limits (NULL: none)."""
    await conn.execute(q["kind_limits_set"], kind, concurrency, rate, per)


async def kind_limits_list(conn: Conn, q: Queries) -> list[Record]:
    """Kinds with a limit, by name."""
    return await conn.fetch(q["kind_limits_list"])
