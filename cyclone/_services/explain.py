"""Why a run is not running (``client.explain``): two reads by key in one snapshot, the run
and its open nodes' facts (``sql/explain.sql``), and the pure functions that tell each
node's :class:`~cyclone._model.explain.Reason` from its facts, in words."""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Any, Literal

from cyclone._model import codec
from cyclone._model.errors import RunNotFoundError
from cyclone._model.explain import Explanation, LimitReached, Reason, ReasonCode
from cyclone._model.handles import RunState
from cyclone._model.keyring import Keyring, shown
from cyclone._model.sleeps import SleepStep
from cyclone._model.stats import WorkerInfo
from cyclone._services.database import Database
from cyclone._storage import queries as db

EXPLAIN_NODES = 100
"""Open nodes explained at once; a run with more (a large map) has the rest counted."""
AHEAD_MAX = 1000
"""Tasks ahead of a node counted at most (``node_explain``'s bound)."""


async def explain(
    database: Database, run_id: uuid.UUID, cipher: Keyring | None = None
) -> Explanation:
    """Why run ``run_id`` is not running; :class:`RunNotFoundError` if it is not visible.
    Sealed error messages are opened with ``cipher``, or redacted without their key."""
    q = database.queries
    # One snapshot for both reads: the run's state and its nodes' facts agree.
    async with database.acquire() as conn, conn.transaction(isolation="repeatable_read"):
        run = await db.run_get(conn, q, run_id)
        if run is None:
            raise RunNotFoundError(run_id)
        state = RunState(run["state"])
        if state.terminal:
            return Explanation(run_id, state, (ended(run, cipher),))
        rows = await db.node_explain(conn, q, run_id, EXPLAIN_NODES)
    omitted = rows[0]["open"] - len(rows) if rows else 0
    return Explanation(run_id, state, tuple(reason(r, cipher) for r in rows), omitted)


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def _at(when: dt.datetime) -> str:
    return f"{when.astimezone(dt.UTC):%Y-%m-%d %H:%M:%S} UTC"


def ended(run: db.Record, cipher: Keyring | None = None) -> Reason:
    """The one reason of a run that has ended (a ``run_get`` row)."""
    state = RunState(run["state"])
    at = _at(run["finished_at"])
    if state == RunState.COMPLETED:
        return Reason(None, ReasonCode.COMPLETED, f"The run completed at {at}.")
    if state == RunState.CANCELLED:
        return Reason(None, ReasonCode.CANCELLED, f"The run was cancelled at {at}.")
    if state == RunState.EXPIRED:
        return Reason(
            None,
            ReasonCode.EXPIRED,
            f"The job expired at {at} before a worker started it, and never ran: enqueue it "
            "again, with a later expiry if it waits that long.",
        )
    error = codec.decode(shown(cipher, run["error"]), dict[str, Any]) if run["error"] else {}
    why = f": {error.get('type')}: {error.get('message')}" if error else ""
    return Reason(
        None,
        ReasonCode.FAILED,
        f"The run failed at {at}{why}. Re-open it with run.retry_all() or "
        f"`cyclone runs retry {run['id']}`.",
    )


def reason(row: db.Record, cipher: Keyring | None = None) -> Reason:
    """The reason of one open node, from its ``node_explain`` row."""
    if row["state"] == "pending":
        parents = tuple(row["parents"] or ())
        which = ", ".join(parents) if parents else "its dependencies"
        return Reason(
            row["node"],
            ReasonCode.WAITING_ON_PARENTS,
            f"Waits for {which} to complete.",
            queue=row["queue"],
            parents=parents,
        )
    if row["state"] == "waiting":
        return _waiting(row)
    if row["task_state"] == "running":
        return _running(row)
    if not row["claimable"]:
        return _scheduled(row, cipher)
    return _claimable(row)


def _waiting(row: db.Record) -> Reason:
    node = row["node"]
    if row["child_run"] is not None:
        child = row["child_run"]
        return Reason(
            node,
            ReasonCode.WAITING_ON_CHILD_RUN,
            f"Waits for its child run {child} ({row['child_state']}) to end; "
            f"`cyclone runs why {child}` says why that one is not done.",
            child_run=child,
        )
    if row["items_left"] is not None:
        left, items = row["items_left"], row["items"]
        return Reason(
            node,
            ReasonCode.WAITING_ON_ITEMS,
            f"Waits for {left} of its {items} items to finish; each item has a reason of its own.",
            items_left=left,
        )
    until = row["wait_until"]
    if row["kind"] is not None and row["kind"].startswith(SleepStep.PREFIX):
        return Reason(
            node,
            ReasonCode.SLEEPING,
            f"Sleeping until {_at(until)}; then it completes and the nodes after it run.",
            until=until,
        )
    timeout = f"; without one it fails at {_at(until)}" if until is not None else ""
    return Reason(
        node,
        ReasonCode.WAITING_FOR_SIGNAL,
        f"Waits since {_at(row['waiting_since'])} for its signal: send it with "
        f"client.signal(run_id, {node!r}, payload) or `cyclone runs signal RUN_ID "
        f"{node}`{timeout}.",
        since=row["waiting_since"],
        until=until,
    )


def _presence(row: db.Record) -> WorkerInfo | None:
    if row["host"] is None:
        return None
    return WorkerInfo(
        id=row["worker"],
        host=row["host"],
        pid=row["pid"],
        queues=row["queues"],
        kinds=row["kinds"],
        workflows=row["workflows"],
        started_at=row["worker_started_at"],
        seen_at=row["seen_at"],
    )


def _running(row: db.Record) -> Reason:
    node, worker, lease = row["node"], row["worker"], row["lease_until"]
    presence = _presence(row)
    common: dict[str, Any] = {"queue": row["queue"], "worker": worker, "presence": presence}
    if row["lease_expired"]:
        last = " or, as it was its last attempt, fails it" if _last_attempt(row) else ""
        return Reason(
            node,
            ReasonCode.LEASE_EXPIRED,
            f"Its lease ran out at {_at(lease)}: worker {worker} stopped renewing it. The "
            f"next maintenance pass of any worker takes it back{last}.",
            since=lease,
            **common,
        )
    if presence is None or not row["live"]:
        heard = f"; last heartbeat {_at(presence.seen_at)}" if presence is not None else ""
        return Reason(
            node,
            ReasonCode.RUNNING_WORKER_LOST,
            f"Claimed by worker {worker}, which is gone (no live presence row{heard}): "
            f"maintenance takes its task back when its lease runs out, at {_at(lease)}.",
            since=None if presence is None else presence.seen_at,
            until=lease,
            **common,
        )
    where = f"worker {worker} ({presence.host}, pid {presence.pid})"
    if row["held"] is False:
        release = min(row["release_at"], lease)
        return Reason(
            node,
            ReasonCode.RUNNING_WORKER_LOST,
            f"Claimed by {where}, whose session with the database ended (its liveness "
            f"lock is free): its peers release its task by {_at(release)}, and it runs "
            f"again as its next attempt.",
            since=presence.seen_at,
            until=release,
            **common,
        )
    return Reason(
        node,
        ReasonCode.RUNNING_ALIVE,
        f"Running on {where}, last heartbeat {_at(presence.seen_at)}; its lease runs "
        f"until {_at(lease)} and is renewed while the handler runs.",
        since=row["started_at"],
        until=lease,
        **common,
    )


def _last_attempt(row: db.Record) -> bool:
    return bool(row["attempt"] >= row["max_attempts"])


def _scheduled(row: db.Record, cipher: Keyring | None) -> Reason:
    due = row["available_at"]
    attempt = row["attempt"]
    text = f"Scheduled: due at {_at(due)}; a worker claims it from then on."
    if attempt:
        last_error = row["last_error"]
        error = codec.decode(shown(cipher, last_error), dict[str, Any]) if last_error else {}
        last = (
            f"; the last error was {error.get('type')}: {error.get('message')} "
            f"(attempt {error.get('attempt')})"
            if error
            else ""
        )
        text = f"Attempt {attempt + 1} of {row['max_attempts']} is due at {_at(due)}{last}."
    return Reason(row["node"], ReasonCode.SCHEDULED, text, queue=row["queue"], until=due)


def _claimable(row: db.Record) -> Reason:
    node, queue = row["node"], row["queue"]
    if row["blocker"] is not None:
        blocker = row["blocker"]
        if row["blocker_state"] == "failed":
            why = "failed and blocks the sequence until it is retried or cancelled"
        else:
            why = f"is {row['blocker_state']} and comes first"
        return Reason(
            node,
            ReasonCode.SEQUENCE_BLOCKED,
            f"Waits for its turn in its sequence: run {blocker} {why}.",
            queue=queue,
            held_by=(blocker,),
        )
    if row["paused"]:
        return Reason(
            node,
            ReasonCode.QUEUE_PAUSED,
            f"Queue {queue!r} is paused: nothing of it starts. Resume it with "
            f"client.queues.resume({queue!r}) or `cyclone queues resume {queue}`.",
            queue=queue,
        )
    if not row["served"]:
        workflow = row["workflow"]
        needs = f"kind {row['kind']!r}" + (f" of workflow {workflow!r}" if workflow else "")
        given = f"workflows=[{workflow}]" if workflow else f"the step of {row['kind']!r}"
        return Reason(
            node,
            ReasonCode.NO_WORKER,
            f"No live worker serves it: none claims from queue {queue!r} and runs {needs}. "
            f"Start a worker with {given} and {queue!r} in its queues= (`cyclone stats` "
            f"counts such work as unserved).",
            queue=queue,
        )
    limited = _limit(row)
    if limited is not None:
        return limited
    ahead = row["ahead"]
    if ahead:
        count = _count(ahead, "other claimable task") + (" or more" if ahead >= AHEAD_MAX else "")
        turns = (
            f", of its group key {row['group_key']!r} (keys take turns)" if row["group_key"] else ""
        )
        return Reason(
            node,
            ReasonCode.BEHIND_OTHERS,
            f"Claimable, but the claim takes {count} of queue {queue!r}{turns} first (by "
            f"priority, then age): it starts once workers have claimed them.",
            queue=queue,
            ahead=ahead,
        )
    return Reason(
        node,
        ReasonCode.READY,
        f"Claimable now and first in line, and a live worker serves queue {queue!r}: it "
        f"starts within a poll interval.",
        queue=queue,
    )


def _limit(row: db.Record) -> Reason | None:
    """A full concurrency limit, else a spent rate, of the queue, the kind or the group key."""
    queue, kind, key = row["queue"], row["kind"], row["group_key"]
    fixes = {
        "queue": f"client.queues.set_limits({queue!r}, ...)",
        "kind": f"client.queues.set_kind_limits({kind!r}, ...)",
        "group": f"client.queues.set_limits({queue!r}, ...)",
    }
    names = {"queue": queue, "kind": kind, "group": key}
    words = {
        "queue": f"queue {queue!r}",
        "kind": f"kind {kind!r}",
        "group": f"group key {key!r} on queue {queue!r}",
    }
    scopes: tuple[tuple[Literal["queue", "kind", "group"], str], ...] = (
        ("queue", "queue"),
        ("kind", "kind"),
        ("group", "key"),
    )
    for scope, column in scopes:
        limit, running = row[f"{column}_concurrency"], row[f"{column}_running"]
        if limit is not None and running is not None and running >= limit:
            held_by = tuple(row["holders"] or ())
            return Reason(
                row["node"],
                ReasonCode.CONCURRENCY_LIMIT,
                f"The concurrency limit of {words[scope]} is full: {running} running of "
                f"{limit}, held by {_count(len(held_by), 'run')} "
                f"{', '.join(map(str, held_by))}. It starts when one of them ends, or once "
                f"the limit is raised ({fixes[scope]}).",
                queue=queue,
                limit=LimitReached(scope, names[scope], limit),
                held_by=held_by,
            )
    for scope, column in scopes:
        until = row[f"{column}_rate_until"]
        if until is not None:
            rate, per = row[f"{column}_rate"], row[f"{column}_per"]
            return Reason(
                row["node"],
                ReasonCode.RATE_LIMIT,
                f"The rate limit of {words[scope]} ({_count(rate, 'start')} per {per:g} s) "
                f"is used up: its next start is due at {_at(until)}, sooner if the limit is "
                f"raised ({fixes[scope]}).",
                queue=queue,
                until=until,
                limit=LimitReached(scope, names[scope], rate, per),
            )
    return None
