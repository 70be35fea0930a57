"""The ``debounce=`` and ``throttle=`` options of a single enqueue (docs/debounce.md), checked
when they are made, so that a bad one never reaches the insert path.

- :class:`Debounce`: while the key's run waits (its task never claimed), an enqueue with the
  key pushes that run's start back and gives it the new input (or the merge of the two)
  instead of making another run.
- :class:`Throttle`: the first enqueue of a key opens a period; until it passes, an enqueue
  with the key makes nothing and names the run that opened it.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from cyclone._model.errors import InvalidInputError, InvalidOptionError
from cyclone._model.keys import validate_key

In = TypeVar("In")


def _duration(value: object, *, what: str) -> dt.timedelta:
    """A timedelta or a number of seconds, as a timedelta; not negative."""
    if isinstance(value, dt.timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, int | float) and not isinstance(value, bool):
        seconds = float(value)
    else:
        raise InvalidInputError(
            f"{what} must be a timedelta or a number of seconds, got {type(value).__name__}"
        )
    if not (seconds >= 0 and math.isfinite(seconds)):  # refuses NaN too
        raise InvalidOptionError(f"{what} must be a finite duration, not negative; got {value!r}")
    return dt.timedelta(seconds=seconds)


@dataclass(frozen=True, slots=True, init=False)
class Debounce(Generic[In]):
    """Debounce a job by ``key``: ``enqueue(..., debounce=cyclone.Debounce(key, delay))``.

    While a run of the same kind with this key has not started (its task was never claimed),
    an enqueue with the key moves that run's start to ``delay`` from now, but never later
    than its first enqueue plus ``max_wait`` (``None``: no cap), and gives it this call's
    input, or ``merge(old, new)`` when ``merge`` is given (it runs in the enqueuing process,
    on the decoded inputs; its result is encoded and checked like any input). The call then
    returns that run's handle, with ``created`` False. Otherwise it makes a new run that
    starts after ``delay``. A run that has started is never changed.

    ``key`` follows the rules of ``unique=`` keys; ``delay`` and ``max_wait`` are timedeltas
    or seconds, and ``max_wait`` is at least ``delay``. Raises :class:`InvalidKeyError` or
    :class:`InvalidInputError` (:class:`InvalidOptionError` for a value out of range) when
    made, before anything is written.
    """

    key: str
    delay: dt.timedelta
    max_wait: dt.timedelta | None
    merge: Callable[[In, In], In] | None

    def __init__(
        self,
        key: str,
        delay: dt.timedelta | float,
        max_wait: dt.timedelta | float | None = None,
        merge: Callable[[In, In], In] | None = None,
    ) -> None:
        wait = _duration(delay, what="debounce delay")
        cap = None if max_wait is None else _duration(max_wait, what="debounce max_wait")
        if cap is not None and cap < wait:
            raise InvalidOptionError(
                f"debounce max_wait ({cap.total_seconds():g} s) must be at least its delay "
                f"({wait.total_seconds():g} s): a run cannot be pushed back past it"
            )
        if merge is not None and not callable(merge):
            raise InvalidInputError(
                f"debounce merge must be a function (old, new) -> merged, got "
                f"{type(merge).__name__}"
            )
        object.__setattr__(self, "key", validate_key(key, what="debounce key"))
        object.__setattr__(self, "delay", wait)
        object.__setattr__(self, "max_wait", cap)
        object.__setattr__(self, "merge", merge)


@dataclass(frozen=True, slots=True, init=False)
class Throttle:
    """Throttle a job by ``key``: ``enqueue(..., throttle=cyclone.Throttle(key, period))``.

    An enqueue with the key makes a run, runnable at once, unless a run of the same kind was
    made with the key less than ``period`` ago (in any state since): then nothing is written
    and the call returns that run's handle, with ``created`` False.

    ``key`` follows the rules of ``unique=`` keys; ``period`` is a timedelta or seconds,
    more than zero. Raises :class:`InvalidKeyError` or :class:`InvalidInputError`
    (:class:`InvalidOptionError` for a value out of range) when made.
    """

    key: str
    period: dt.timedelta

    def __init__(self, key: str, period: dt.timedelta | float) -> None:
        length = _duration(period, what="throttle period")
        if not length:
            raise InvalidOptionError("throttle period must be more than zero")
        object.__setattr__(self, "key", validate_key(key, what="throttle key"))
        object.__setattr__(self, "period", length)


def check_gates(
    debounce: object,
    throttle: object,
    *,
    unique: object,
    sequence: object,
    process_at: object,
    process_in: object,
) -> tuple[Debounce[Any] | None, Throttle | None]:
    """The ``debounce=`` and ``throttle=`` options, refused where they make no sense with
    the others: each decides by its key whether this call makes a run, which a unique or
    sequence key decides too, and each says when the run starts, which a process time would
    say again."""
    if debounce is not None and not isinstance(debounce, Debounce):
        raise InvalidInputError(
            f"debounce= takes a cyclone.Debounce(key, delay), got {type(debounce).__name__}"
        )
    if throttle is not None and not isinstance(throttle, Throttle):
        raise InvalidInputError(
            f"throttle= takes a cyclone.Throttle(key, period), got {type(throttle).__name__}"
        )
    gate = "debounce" if debounce is not None else "throttle" if throttle is not None else None
    if gate is None:
        return None, None
    if debounce is not None and throttle is not None:
        raise InvalidInputError(
            "give debounce= or throttle=, not both: one pushes a waiting run back, the other "
            "drops calls after a run started"
        )
    for name, value, why in (
        ("unique", unique, "its key already decides whether this call makes a run"),
        ("sequence", sequence, "a sequence runs every call in turn, which drops none"),
        ("process_at", process_at, f"{gate} decides when the run starts"),
        ("process_in", process_in, f"{gate} decides when the run starts"),
    ):
        if value is not None:
            raise InvalidInputError(f"{gate}= does not go with {name}=: {why}")
    return debounce, throttle
