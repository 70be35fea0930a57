"""Enqueue and submit options: typed for the caller, checked, normalised, and ready for SQL.

The ``TypedDict`` classes tell a type checker the options each call takes (``**options:
Unpack[EnqueueOptions]``); ``parse`` checks the values at run time all the same. Every check
runs before any database write, so a bad option never leaves a row behind.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypedDict

from cyclone._model.debounce import Debounce, Throttle, check_gates
from cyclone._model.errors import InvalidInputError, InvalidNameError
from cyclone._model.keys import validate_key

_QUEUE = re.compile(r"^[A-Za-z0-9_.:-]{1,128}$")
_INT32 = 2**31 - 1


class SubmitOptions(TypedDict, total=False):
    """Options of a workflow submit (``submit``, ``submit_once`` and their ``_tx`` forms).

    ``process_at`` is an aware datetime; ``process_in`` a timedelta or seconds; ``priority``
    an int (higher first); ``run_deadline`` an aware datetime by which the run must end;
    ``group`` a group key (a tenant id, say): the claim takes turns across the group keys
    of a queue, and a queue's ``key_concurrency`` limits each key (docs/flow-control.md).
    """

    process_at: dt.datetime
    process_in: dt.timedelta | float
    priority: int
    run_deadline: dt.datetime
    group: str


class EnqueueManyOptions(SubmitOptions, total=False):
    """Options of ``enqueue_many``: a submit's, plus ``queue``, ``sequence``,
    ``max_attempts`` and an expiry (``unique`` applies to a single enqueue only).

    ``expires_at`` (an aware datetime) or ``expires_in`` (a timedelta or seconds from now):
    a job not started by then never runs; it ends :attr:`RunState.EXPIRED`. Once started it
    no longer expires, its retries included.
    """

    queue: str
    sequence: str
    max_attempts: int
    expires_at: dt.datetime
    expires_in: dt.timedelta | float


class EnqueueOptions(EnqueueManyOptions, total=False):
    """Options of a single ``enqueue``: ``enqueue_many``'s, plus the ``unique`` key, and
    ``debounce`` or ``throttle`` (docs/debounce.md)."""

    unique: str
    debounce: Debounce[Any]
    throttle: Throttle


def validate_queue(queue: object) -> str:
    """Queue names are short words: letters, digits and ``_ . : -``."""
    if not isinstance(queue, str) or not _QUEUE.fullmatch(queue):
        raise InvalidNameError(
            f"queue must be 1-128 characters of letters, digits, '_', '.', ':' or '-'; "
            f"got {queue!r}"
        )
    return queue


def validate_int(value: object, *, what: str, low: int, high: int = _INT32) -> int:
    """An int (not bool) between ``low`` and ``high`` (by default the int32 limit)."""
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise InvalidInputError(f"{what} must be an int from {low} to {high}, got {value!r}")
    return value


def _aware(value: object, *, what: str) -> dt.datetime:
    if not isinstance(value, dt.datetime):
        raise InvalidInputError(f"{what} must be a datetime, got {type(value).__name__}")
    if value.tzinfo is None or value.utcoffset() is None:
        raise InvalidInputError(f"{what} must be timezone-aware (naive datetimes are ambiguous)")
    return value


def seconds(value: object, *, what: str) -> float:
    """A non-negative duration given as a timedelta or a number of seconds."""
    if isinstance(value, dt.timedelta):
        value = value.total_seconds()
    if isinstance(value, bool) or not isinstance(value, int | float) or not value >= 0:
        raise InvalidInputError(f"{what} must be a non-negative timedelta or seconds")
    return float(value)


@dataclass(frozen=True, slots=True)
class Options:
    """Normalised options of one enqueue or submit call."""

    queue: str | None = None
    process_at: dt.datetime | None = None
    unique: str | None = None
    sequence: str | None = None
    priority: int | None = None
    max_attempts: int | None = None
    run_deadline: dt.datetime | None = None
    group: str | None = None
    debounce: Debounce[Any] | None = None
    throttle: Throttle | None = None
    expires_at: dt.datetime | None = None

    @property
    def gated(self) -> bool:
        """Whether a debounce or throttle key may send the call to an existing run."""
        return self.debounce is not None or self.throttle is not None

    def claimable_now(self) -> bool:
        """Whether the work is claimable at commit, which is when a wakeup is worth sending."""
        return self.process_at is None or self.process_at <= dt.datetime.now(dt.UTC)


def parse(
    *,
    queue: object = None,
    process_at: object = None,
    process_in: object = None,
    unique: object = None,
    sequence: object = None,
    priority: object = None,
    max_attempts: object = None,
    run_deadline: object = None,
    group: object = None,
    debounce: object = None,
    throttle: object = None,
    expires_at: object = None,
    expires_in: object = None,
) -> Options:
    """Check every option and return them normalised; raise before anything is written."""
    debounced, throttled = check_gates(
        debounce,
        throttle,
        unique=unique,
        sequence=sequence,
        process_at=process_at,
        process_in=process_in,
    )
    if process_at is not None and process_in is not None:
        raise InvalidInputError("give process_at or process_in, not both")
    at = None
    if process_at is not None:
        at = _aware(process_at, what="process_at")
    elif process_in is not None:
        at = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=seconds(process_in, what="process_in"))
    expiry = _expiry(expires_at, expires_in, due=at)
    if expiry is not None and (debounced is not None or throttled is not None):
        raise InvalidInputError(
            "expires_at/expires_in cannot be combined with debounce= or throttle=, whose "
            "enqueues may land on a run already waiting: give the expiry to plain enqueues"
        )
    return Options(
        queue=None if queue is None else validate_queue(queue),
        process_at=at,
        unique=None if unique is None else validate_key(unique, what="unique key"),
        sequence=None if sequence is None else validate_key(sequence, what="sequence key"),
        priority=None if priority is None else validate_int(priority, what="priority", low=-_INT32),
        max_attempts=(
            None if max_attempts is None else validate_int(max_attempts, what="max_attempts", low=1)
        ),
        run_deadline=None if run_deadline is None else _aware(run_deadline, what="run_deadline"),
        group=None if group is None else validate_key(group, what="group key"),
        debounce=debounced,
        throttle=throttled,
        expires_at=expiry,
    )


def _expiry(
    expires_at: object, expires_in: object, *, due: dt.datetime | None
) -> dt.datetime | None:
    """When a job expires, from ``expires_at`` or ``expires_in``; it must be after ``due``
    (its process_at), or the job could never start."""
    if expires_at is not None and expires_in is not None:
        raise InvalidInputError("give expires_at or expires_in, not both")
    if expires_at is not None:
        expiry = _aware(expires_at, what="expires_at")
    elif expires_in is not None:
        expiry = dt.datetime.now(dt.UTC) + dt.timedelta(
            seconds=seconds(expires_in, what="expires_in")
        )
    else:
        return None
    if due is not None and expiry <= due:
        raise InvalidInputError(
            f"the job would expire ({expiry.isoformat()}) before it is due "
            f"({due.isoformat()}): give an expiry after process_at/process_in"
        )
    return expiry


def check_options(options: Mapping[str, Any], allowed: frozenset[str], *, call: str) -> Options:
    """Reject unknown option names, then parse the rest."""
    unknown = sorted(set(options) - allowed)
    expiry = [name for name in unknown if name in ("expires_at", "expires_in")]
    if expiry:
        raise InvalidInputError(
            f"{expiry[0]} applies to standalone jobs only, not to {call}: give the workflow a "
            "run_deadline to bound how long its run may take"
        )
    if unknown:
        known = ", ".join(sorted(allowed))
        raise InvalidInputError(
            f"unknown option(s) {', '.join(unknown)} for {call}; known: {known}"
        )
    return parse(**options)
