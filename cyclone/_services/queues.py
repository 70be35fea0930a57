"""Flow control at run time: ``client.queues`` pauses queues and sets their limits.

The limits live in the database (migration 0008) and the claim enforces them, whichever
worker claims: nothing here runs in the worker. A change applies from the next claim on and
interrupts nothing running: lowering a limit below what runs lets the surplus finish and
starts nothing until the count is under it. Resuming wakes the queue's workers at once.
Every value is checked before anything is written (docs/flow-control.md).
"""

from __future__ import annotations

import builtins
import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from cyclone._model.errors import InvalidLimitError, UnknownQueueError
from cyclone._model.keys import validate_name
from cyclone._model.options import validate_queue
from cyclone._services.database import Database
from cyclone._services.publisher import Publisher
from cyclone._storage import queries as db

_INT32 = 2**31 - 1


def _count(value: object, *, what: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidLimitError(f"{what} must be an int of at least 1 or None, got {value!r}")
    if not 1 <= value <= _INT32:
        raise InvalidLimitError(
            f"{what} must be at least 1 (None for no limit; pause() stops a queue), got {value}"
        )
    return value


def _period(
    rate: int | None, per: object, *, names: tuple[str, str] = ("rate", "per")
) -> float | None:
    rate_name, per_name = names
    if isinstance(per, dt.timedelta):
        per = per.total_seconds()
    if per is not None and (isinstance(per, bool) or not isinstance(per, int | float)):
        raise InvalidLimitError(f"{per_name} must be a timedelta or seconds, got {per!r}")
    if rate is None:
        if per is not None:
            raise InvalidLimitError(
                f"{per_name}= was given without {rate_name}=: give both, or neither"
            )
        return None
    if per is None:
        raise InvalidLimitError(
            f"{rate_name}={rate} needs its period: {per_name}=1.0 for {rate} starts a second, say"
        )
    if not per > 0 or per != per or per == float("inf"):
        raise InvalidLimitError(
            f"{per_name} must be a positive, finite number of seconds, got {per!r}"
        )
    return float(per)


@dataclass(frozen=True, slots=True)
class QueueLimits:
    """A queue's limits, across every worker; ``None`` is no limit.

    ``concurrency``: tasks of the queue running at once. ``rate`` starts per ``per`` (a
    timedelta or seconds): a token bucket of ``rate`` tokens refilled evenly over ``per``,
    so over any long span the queue starts ``rate`` per ``per``, and never more than
    ``rate`` at once after a quiet spell. ``key_concurrency``: tasks of each group key
    (the ``group=`` enqueue option) running at once. ``key_rate`` starts per ``key_per``
    for each group key: a sliding window, so no key starts more than ``key_rate`` in any
    ``key_per`` seconds. Work without a key is not held by the per-key limits. Checked on
    construction.
    """

    concurrency: int | None = None
    rate: int | None = None
    per: float | None = None
    key_concurrency: int | None = None
    key_rate: int | None = None
    key_per: float | None = None

    def __post_init__(self) -> None:
        _count(self.concurrency, what="concurrency")
        _count(self.rate, what="rate")
        _count(self.key_concurrency, what="key_concurrency")
        _count(self.key_rate, what="key_rate")
        object.__setattr__(self, "per", _period(self.rate, self.per))
        key_per = _period(self.key_rate, self.key_per, names=("key_rate", "key_per"))
        object.__setattr__(self, "key_per", key_per)


@dataclass(frozen=True, slots=True)
class KindLimits:
    """A kind's limits, across every worker and every queue it runs on; ``None`` is no
    limit. ``concurrency`` and ``rate``/``per`` as for :class:`QueueLimits`."""

    concurrency: int | None = None
    rate: int | None = None
    per: float | None = None

    def __post_init__(self) -> None:
        _count(self.concurrency, what="concurrency")
        _count(self.rate, what="rate")
        object.__setattr__(self, "per", _period(self.rate, self.per))


@dataclass(frozen=True, slots=True)
class QueueSettings:
    """A queue's stored flow control: whether it is paused, and its limits."""

    queue: str
    paused: bool
    limits: QueueLimits


class Queues:
    """``client.queues``: pause and resume queues, and set the limits that every worker's
    claim obeys (docs/flow-control.md).

    A queue with no setting that no live worker claims from raises
    :class:`UnknownQueueError` (a typo, most likely); ``create=True`` configures a queue
    before its workers start.
    """

    def __init__(self, database: Database, publisher: Publisher) -> None:
        self._database = database
        self._publisher = publisher

    async def pause(self, queue: str, *, create: bool = False) -> bool:
        """Stop every worker claiming from ``queue`` (within one poll interval); running
        work finishes. Whether this call paused it (False: it was paused already)."""
        return await self._set_paused(queue, True, create=create)

    async def resume(self, queue: str, *, create: bool = False) -> bool:
        """Let workers claim from ``queue`` again, waking them at once. Whether this call
        resumed it (False: it was not paused)."""
        return await self._set_paused(queue, False, create=create)

    async def set_limits(
        self,
        queue: str,
        *,
        concurrency: int | None = None,
        rate: int | None = None,
        per: dt.timedelta | float | None = None,
        key_concurrency: int | None = None,
        key_rate: int | None = None,
        key_per: dt.timedelta | float | None = None,
        create: bool = False,
    ) -> QueueLimits:
        """Replace ``queue``'s limits (a limit left out is cleared); see :class:`QueueLimits`.
        The next claim obeys them; nothing running is interrupted."""
        limits = QueueLimits(
            concurrency, rate, _seconds(per), key_concurrency, key_rate, _seconds(key_per)
        )
        await self.apply({queue: limits}, create=create)
        return limits

    async def set_kind_limits(
        self,
        kind: str,
        *,
        concurrency: int | None = None,
        rate: int | None = None,
        per: dt.timedelta | float | None = None,
    ) -> KindLimits:
        """Replace ``kind``'s limits, which hold across every queue it runs on."""
        limits = KindLimits(concurrency, rate, _seconds(per))
        await self.apply({}, kinds={kind: limits})
        return limits

    async def apply(
        self,
        queues: Mapping[str, QueueLimits],
        *,
        kinds: Mapping[str, KindLimits] | None = None,
        create: bool = True,
    ) -> None:
        """Set limits declared in code, all in one transaction (at an app's start, say):
        each named queue and kind gets exactly these limits. Pausing is left as it is."""
        kinds = kinds or {}
        for name, limits in queues.items():
            validate_queue(name)
            if not isinstance(limits, QueueLimits):
                raise InvalidLimitError(f"queue {name!r}: expected a QueueLimits, got {limits!r}")
        for name, kind_limits in kinds.items():
            validate_name(name, what="kind")
            if not isinstance(kind_limits, KindLimits):
                raise InvalidLimitError(
                    f"kind {name!r}: expected a KindLimits, got {kind_limits!r}"
                )
        queries = self._database.queries
        async with self._database.transact() as conn:
            for name in sorted(queues):
                if not create:
                    await self._check_known(conn, name)
                q = queues[name]
                await db.queue_limits_set(
                    conn,
                    queries,
                    name,
                    q.concurrency,
                    q.rate,
                    q.per,
                    q.key_concurrency,
                    q.key_rate,
                    q.key_per,
                )
            for name in sorted(kinds):
                k = kinds[name]
                await db.kind_limits_set(conn, queries, name, k.concurrency, k.rate, k.per)
        # A raised limit may let waiting work start: wake the queues' workers.
        self._publisher.wake(queues)

    async def get(self, queue: str) -> QueueSettings:
        """``queue``'s flow control (not paused and no limits if none was ever set)."""
        async with self._database.acquire() as conn:
            rows = await db.queue_list(conn, self._database.queries, validate_queue(queue))
        return _settings(rows[0]) if rows else QueueSettings(queue, False, QueueLimits())

    async def list(self) -> builtins.list[QueueSettings]:
        """Every queue that is paused or limited, by name."""
        async with self._database.acquire() as conn:
            rows = await db.queue_list(conn, self._database.queries, None)
        return [_settings(r) for r in rows]

    async def kind_limits(self) -> dict[str, KindLimits]:
        """Every kind with a limit."""
        async with self._database.acquire() as conn:
            rows = await db.kind_limits_list(conn, self._database.queries)
        return {r["kind"]: KindLimits(r["concurrency"], r["rate"], r["per"]) for r in rows}

    async def _set_paused(self, queue: str, paused: bool, *, create: bool) -> bool:
        validate_queue(queue)
        async with self._database.transact() as conn:
            if not create:
                await self._check_known(conn, queue)
            was = await db.queue_pause_set(conn, self._database.queries, queue, paused)
        if not paused:  # after the commit: the woken workers must see the resumed row
            self._publisher.wake([queue])
        return was != paused

    async def _check_known(self, conn: db.Conn, queue: str) -> None:
        if not await db.queue_known(conn, self._database.queries, queue):
            raise UnknownQueueError(queue)


def _seconds(per: dt.timedelta | float | None) -> float | None:
    if isinstance(per, dt.timedelta):
        return per.total_seconds()
    return per


def _settings(row: db.Record) -> QueueSettings:
    limits = QueueLimits(
        row["concurrency"],
        row["rate"],
        row["per"],
        row["key_concurrency"],
        row["key_rate"],
        row["key_per"],
    )
    return QueueSettings(row["queue"], row["paused"], limits)


def flow_fields(row: db.Record | None) -> dict[str, Any]:
    """A queue's flow control, as the fields of its QueueStats."""
    if row is None:
        return {}
    return {
        "paused": row["paused"],
        "concurrency_limit": row["concurrency"],
        "rate_limit": None if row["rate"] is None else (row["rate"], row["per"]),
        "key_concurrency_limit": row["key_concurrency"],
        "key_rate_limit": None if row["key_rate"] is None else (row["key_rate"], row["key_per"]),
    }
