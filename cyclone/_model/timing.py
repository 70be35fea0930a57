"""When a schedule's slots are, and which of them one firing pass fires. Pure: no I/O, time
is a parameter.

A schedule's :class:`Timing` is a cron expression in a time zone or an interval from a start;
its slots are the times it names. :func:`plan` picks, from the oldest unfired slot to now, the
slots to fire under a catch-up policy (the policies themselves are declared and checked with
the schedule, in ``schedules``).

Cron expressions are the standard five fields (or an ``@hourly``-style alias), read by
``cronsim`` in the schedule's time zone. Across DST changes, for an expression with a fixed
minute and hour (``30 2 * * *``) a local time that does not exist fires once at the next valid
time (03:00 on the spring-forward night) and a local time that happens twice fires once (the
first); an expression with a wildcard in the minute or hour keeps real-time spacing: ``30 * *
* *`` fires every real hour, twice at 02:30 local on the fall-back night, never at a skipped
02:30. ``every=`` slots are UTC instants ``start + k * every`` and know no DST.
"""

from __future__ import annotations

import collections
import datetime as dt
from collections.abc import Iterator
from dataclasses import dataclass
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError

from cyclone._model.errors import InvalidScheduleError

# Slots less than this late are on time, whatever the catch-up policy: a worker that restarts
# or stalls for a moment fires them late rather than drops them.
GRACE = dt.timedelta(seconds=10)
# The most slots one catch-up fires for one schedule, however long the window.
MAX_CATCH_UP = 1000

_ALIASES = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
# The fields of a cron expression, in order, by the names cronsim's errors give them: the
# first and last number each takes.
_CRON_FIELDS = {
    "minute": (0, 59),
    "hour": (0, 23),
    "day-of-month": (1, 31),
    "month": (1, 12),
    "day-of-week": (0, 7),
}
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
_US = dt.timedelta(microseconds=1)


def _zone(tz: object) -> ZoneInfo:
    if isinstance(tz, ZoneInfo):
        return tz
    if not isinstance(tz, str) or not tz:
        raise InvalidScheduleError(f"tz must be an IANA time zone name, got {tz!r}")
    try:
        return ZoneInfo(tz)
    except (ZoneInfoNotFoundError, ValueError):
        raise InvalidScheduleError(
            f"unknown time zone {tz!r}: use an IANA name such as 'Europe/Paris' or 'UTC' "
            "(on Windows, install the tzdata package)"
        ) from None


def _aware(value: object, *, what: str) -> dt.datetime:
    if not isinstance(value, dt.datetime):
        raise InvalidScheduleError(f"{what} must be a datetime, got {type(value).__name__}")
    if value.tzinfo is None or value.utcoffset() is None:
        raise InvalidScheduleError(
            f"{what} must be timezone-aware (a naive datetime is ambiguous): "
            "add tzinfo, e.g. datetime(..., tzinfo=datetime.UTC)"
        )
    return value.astimezone(dt.UTC)


def _cron_problem(expression: str, exc: CronSimError) -> str:
    """What is wrong with a five-field ``expression`` cronsim refused, in cron's words: the
    field, its value and the numbers it takes (cronsim says only ``Bad minute``)."""
    field = str(exc).removeprefix("Bad ")
    if field not in _CRON_FIELDS:  # not about one field: say it as cronsim does
        return str(exc)
    value = expression.split()[list(_CRON_FIELDS).index(field)]
    low, high = _CRON_FIELDS[field]
    for term in value.split(","):
        ends = [int(n) for n in term.partition("/")[0].split("-") if n.isdigit()]
        if out := [n for n in ends if not low <= n <= high]:
            return f"{field} {out[0]} is out of range {low}-{high}"
    if field == "day-of-month" and value.isdigit():
        return f"day-of-month {value} never occurs in month {expression.split()[3]!r}"
    return (
        f"{field} {value!r} is not valid: a field takes numbers {low}-{high}, '*', lists "
        "(1,15), ranges (1-5) and steps of 1 or more (*/15)"
    )


@dataclass(frozen=True, slots=True)
class Timing:
    """When a schedule's slots are: a cron expression in a zone, or an interval from a start.

    Stored with the schedule, so every process computes the same slots from the same row.
    """

    cron: str | None
    every: dt.timedelta | None
    tz: str
    start: dt.datetime | None

    @staticmethod
    def parse(cron: object, every: object, tz: object, start: object) -> Timing:
        """Check a declaration's timing; raise :class:`InvalidScheduleError` if unusable."""
        if (cron is None) == (every is None):
            raise InvalidScheduleError("give a schedule exactly one of cron= or every=")
        zone = _zone(tz)
        if every is not None:
            if isinstance(every, bool) or not isinstance(every, dt.timedelta | int | float):
                raise InvalidScheduleError("every= must be a timedelta or a number of seconds")
            if not isinstance(every, dt.timedelta):
                every = dt.timedelta(seconds=every)
            if every < dt.timedelta(milliseconds=1):
                raise InvalidScheduleError(
                    f"every= must be a positive interval of at least 1 ms, got {every!r}"
                )
            anchor = None if start is None else _aware(start, what="start")
            return Timing(None, every, zone.key, anchor)
        if start is not None:
            raise InvalidScheduleError("start= anchors every= slots; cron= slots take none")
        if not isinstance(cron, str):
            raise InvalidScheduleError(f"cron= must be a str, got {type(cron).__name__}")
        expr = " ".join(cron.split())
        expanded = _ALIASES.get(expr.lower(), expr)
        if expr.startswith("@") and expanded is expr:
            raise InvalidScheduleError(
                f"unknown cron alias {cron!r}; known: {', '.join(sorted(_ALIASES))}"
            )
        if len(expanded.split()) != 5:
            raise InvalidScheduleError(
                f"invalid cron expression {cron!r}: it needs 5 fields "
                "(minute hour day-of-month month day-of-week), e.g. '0 3 * * *'"
            )
        try:
            CronSim(expanded, dt.datetime(2000, 1, 1, tzinfo=zone))
        except CronSimError as exc:
            raise InvalidScheduleError(
                f"invalid cron expression {cron!r}: {_cron_problem(expanded, exc)}"
            ) from None
        return Timing(expr, None, zone.key, None)

    def _expression(self) -> str:
        assert self.cron is not None
        return _ALIASES.get(self.cron.lower(), self.cron)

    def next_after(self, when: dt.datetime) -> dt.datetime:
        """The first slot strictly after ``when`` (aware), in UTC."""
        if self.every is not None:
            anchor = self.start or _EPOCH
            period = self.every // _US
            k = (when - anchor) // _US // period + 1
            return anchor + _US * (k * period)
        local = when.astimezone(ZoneInfo(self.tz))
        return next(CronSim(self._expression(), local)).astimezone(dt.UTC)

    def slots(self, after: dt.datetime, until: dt.datetime) -> Iterator[dt.datetime]:
        """Slots in ``(after, until]``, oldest first."""
        slot = self.next_after(after)
        while slot <= until:
            yield slot
            slot = self.next_after(slot)

    def latest(self, at_or_before: dt.datetime, since: dt.datetime) -> dt.datetime | None:
        """The newest slot in ``[since, at_or_before]``, if any."""
        if self.every is not None:
            anchor = self.start or _EPOCH
            period = self.every // _US
            slot = anchor + _US * ((at_or_before - anchor) // _US // period * period)
            return slot if slot >= since else None
        # Walk forward from the previous slot found in reverse, so the answer is one the
        # forward walk (which knows the DST rules) gives too.
        local = at_or_before.astimezone(ZoneInfo(self.tz))
        try:
            back = next(CronSim(self._expression(), local, reverse=True)).astimezone(dt.UTC)
        except StopIteration:
            back = since
        newest = None
        for slot in self.slots(max(since, back - dt.timedelta(days=1)) - _US, at_or_before):
            newest = slot
        return newest

    def describe(self) -> str:
        """``cron '0 3 * * *' Europe/Paris`` or ``every 0:00:01``, for listings."""
        if self.cron is not None:
            return f"cron {self.cron!r} {self.tz}"
        return f"every {self.every}"


@dataclass(frozen=True, slots=True)
class Plan:
    """What one firing pass does with a schedule: the slots to fire and the next unfired slot.

    ``missed_from`` is the oldest due slot left unfired because it was missed (more than
    :data:`GRACE` late) or blocked by the overlap policy, for the log; None when none was.
    """

    fire: list[dt.datetime]
    next_at: dt.datetime
    missed_from: dt.datetime | None = None


def plan(
    timing: Timing,
    *,
    catch_up: str,
    window: dt.timedelta | None,
    overlap_blocked: bool,
    next_at: dt.datetime,
    now: dt.datetime,
) -> Plan:
    """Which slots from ``next_at`` (the oldest unfired slot) to ``now`` to fire.

    Slots at most :data:`GRACE` late always fire. Older ones are missed: ``skip`` drops them,
    ``latest`` fires the newest of them once, ``all`` fires those within ``window`` (at most
    :data:`MAX_CATCH_UP`, the newest). ``overlap_blocked`` (the previous run is still active
    and the policy is ``skip``) drops every slot due now.
    """
    if next_at > now:
        return Plan([], next_at)
    following = timing.next_after(now)
    if overlap_blocked:
        return Plan([], following, next_at)
    on_time_from = max(next_at, now - GRACE)
    fire: collections.deque[dt.datetime] = collections.deque(maxlen=MAX_CATCH_UP)
    if catch_up == "all" and window is not None:
        fire.extend(timing.slots(max(next_at, now - window) - _US, now))
    else:
        if catch_up == "latest" and next_at < on_time_from:
            missed = timing.latest(on_time_from - _US, next_at)
            if missed is not None:
                fire.append(missed)
        fire.extend(timing.slots(on_time_from - _US, now))
    fired = list(fire)
    missed_from = next_at if not fired or fired[0] > next_at else None
    return Plan(fired, following, missed_from)
