"""Debounced and throttled jobs: the writes of an enqueue whose key may send the call to the
key's run instead of making one (``cyclone.Debounce``, ``cyclone.Throttle``).

Both are exact under concurrency because two enqueues of one key always meet at one row:

- Debounce: the unique index ``idx_tasks_debounce`` allows one waiting (never claimed) task
  per kind and key. ``job_debounce`` pushes that task, locked, or inserts one; an insert that
  meets another's uncommitted insert waits for it, inserts nothing if it committed, and is
  sent again: it then finds that run and pushes it. A claim and a push meet at the task row:
  the claim skips a task a push holds; a push waits for a claim that holds it and then finds
  it started (claims > 0), and makes a new run. A run that started is never changed.
- Throttle: the key's row in ``cyclone_throttles``, which ``job_throttle`` inserts or takes
  over with ``ON CONFLICT``: the second enqueue waits for the first and judges the row as the
  first left it.

Neither takes a lock outside its rows, so neither needs a transaction of its own except a
merge, which reads the waiting run's input, merges it in Python, and writes it back while
its task stays locked. In REPEATABLE READ or SERIALIZABLE, a key whose row changed after the
transaction's snapshot raises SQLSTATE 40001, as ``submit_once`` does.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from cyclone._model import codec
from cyclone._model.errors import KeyContentionError
from cyclone._storage import queries as db
from cyclone._storage.loader import Queries

if TYPE_CHECKING:
    from cyclone._model.debounce import Debounce
    from cyclone._model.options import Options
    from cyclone._model.steps import Kind

# An enqueue of the key can insert the key's run between our look and our insert; then we
# look again. Each try waits for the other enqueue's commit, so a few are plenty.
_TRIES = 3


@dataclass(frozen=True, slots=True)
class Written:
    """What a debounced or throttled enqueue did: the run it names, whether it made that run,
    and whether the run is claimable at commit (then a wakeup is worth sending)."""

    run_id: uuid.UUID
    created: bool
    due: bool


def merges(options: Options) -> bool:
    """Whether an enqueue merges inputs, which needs a transaction (read, merge, write)."""
    return options.debounce is not None and options.debounce.merge is not None


async def write(
    conn: db.Conn,
    q: Queries,
    job: db.GatedJob,
    *,
    kind: Kind[Any, Any],
    value: Any,
    options: Options,
    limit: int,
) -> Written:
    """Write ``job`` (the checked, encoded ``value`` of ``kind``), which has a debounce or
    throttle in ``options``, on ``conn``; ``limit``: the client's input limit, for a merge."""
    if options.throttle is not None:
        return await _throttle(conn, q, job, options.throttle.key, options.throttle.period)
    assert options.debounce is not None
    merge = _Merge(kind, value, options.debounce, limit)
    return await _debounce(conn, q, job, options.debounce, merge)


async def _throttle(
    conn: db.Conn, q: Queries, job: db.GatedJob, key: str, period: dt.timedelta
) -> Written:
    for _ in range(_TRIES):
        if await db.job_throttle(conn, q, job, key=key, period=period.total_seconds()):
            return Written(job.id, created=True, due=True)
        holder = await db.job_throttle_find(conn, q, job.kind, key)
        if holder is not None:
            return Written(holder, created=False, due=False)
        # Unreachable while throttle rows are never deleted; kept exact if they ever are.
    raise KeyContentionError("throttle", key, job.kind)


@dataclass(frozen=True, slots=True)
class _Merge:
    """What a merge needs: the kind (its input type), this call's input, the debounce and
    the client's input limit."""

    kind: Kind[Any, Any]
    value: Any
    debounce: Debounce[Any]
    limit: int

    def apply(self, job: db.GatedJob, stored: str) -> db.GatedJob:
        """``job`` with the merge of the waiting run's input and this call's as its input."""
        assert self.debounce.merge is not None
        tp = self.kind.input_type
        merged = self.debounce.merge(codec.decode(stored, tp), self.value)
        what = f"merged input of step {self.kind.name!r} (debounce key {self.debounce.key!r})"
        return dataclasses.replace(job, input=codec.encode(merged, tp, what=what, limit=self.limit))


async def _debounce(
    conn: db.Conn, q: Queries, job: db.GatedJob, debounce: Debounce[Any], merge: _Merge
) -> Written:
    delay = debounce.delay.total_seconds()
    cap = None if debounce.max_wait is None else debounce.max_wait.total_seconds()
    for _ in range(_TRIES):
        push, value = True, job
        if debounce.merge is not None:
            waiting = await db.job_debounce_find(conn, q, job.kind, debounce.key)
            # Without a waiting run, only insert: a push would replace, not merge, the input
            # of a run another enqueue made meanwhile; the insert conflicts with it instead.
            push = waiting is not None
            if waiting is not None:
                value = merge.apply(job, waiting["input"])
        row = await db.job_debounce(
            conn, q, value, key=debounce.key, delay=delay, max_wait=cap, push=push
        )
        if row is not None:
            return Written(row["id"], created=row["created"], due=row["due"])
    raise KeyContentionError("debounce", debounce.key, job.kind)
