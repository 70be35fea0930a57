"""Schedules: declaration, validation, catch-up and overlap policies, and the keys of slot
runs. Pure: no I/O, time is a parameter.

A schedule makes one run of its target (a step, an action or a workflow) for each of its
slots: the times its ``cron=`` expression or ``every=`` interval names (its :class:`Timing`,
in ``timing``, with the slot arithmetic). Each slot's run is written with the key
``schedule:<name>:<slot in ISO-8601 UTC>`` through a keyed insert, so however many processes
try, one run exists per slot (see :mod:`cyclone._worker.scheduler`).
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Generic, TypeVar
from zoneinfo import ZoneInfo

from cyclone._model import codec
from cyclone._model.errors import InvalidScheduleError
from cyclone._model.steps import Kind
from cyclone._model.timing import Timing

if TYPE_CHECKING:
    from cyclone._model.workflows import Workflow

In = TypeVar("In")

CATCH_UP_POLICIES = ("skip", "latest", "all")
OVERLAP_POLICIES = ("allow", "skip")
KEY_PREFIX = "schedule:"

_NAME = re.compile(r"^[A-Za-z0-9_.:-]{1,128}$")


def validate_name(name: object) -> str:
    """Schedule names are short words: letters, digits and ``_ . : -``."""
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise InvalidScheduleError(
            f"a schedule name must be 1-128 letters, digits, '_', '.', ':' or '-'; got {name!r}"
        )
    return name


def utc_text(when: dt.datetime) -> str:
    """``when`` in ISO-8601 UTC with a ``Z``; microseconds only when there are some."""
    utc = when.astimezone(dt.UTC)
    text = utc.strftime("%Y-%m-%dT%H:%M:%S")
    return f"{text}.{utc.microsecond:06d}Z" if utc.microsecond else f"{text}Z"


def slot_key(name: str, slot: dt.datetime) -> str:
    """The run key of ``name``'s slot at ``slot``."""
    return f"{KEY_PREFIX}{name}:{utc_text(slot)}"


def trigger_key(name: str, at: dt.datetime) -> str:
    """The run key of a ``trigger`` of ``name`` made at ``at``."""
    return f"{KEY_PREFIX}{name}:trigger:{utc_text(at)}"


def _check_policy(catch_up: object, window: object, overlap: object) -> dt.timedelta | None:
    if catch_up not in CATCH_UP_POLICIES:
        raise InvalidScheduleError(
            f"unknown catch_up policy {catch_up!r}; use one of {', '.join(CATCH_UP_POLICIES)}"
        )
    if overlap not in OVERLAP_POLICIES:
        raise InvalidScheduleError(
            f"unknown overlap policy {overlap!r}; use one of {', '.join(OVERLAP_POLICIES)}"
        )
    if catch_up == "all":
        if not isinstance(window, dt.timedelta) or window <= dt.timedelta(0):
            raise InvalidScheduleError(
                "catch_up='all' needs catch_up_window=, a positive timedelta that bounds how "
                "far back missed slots are run"
            )
        return window
    if window is not None:
        raise InvalidScheduleError("catch_up_window= applies to catch_up='all' only")
    return None


class Schedule(Generic[In]):
    """A schedule declared with :func:`cyclone.schedule` (which parses its timing); pass it
    to ``Worker(schedules=)`` or store it at run time with ``client.schedules.create``."""

    def __init__(
        self,
        name: str,
        target: Kind[In, Any] | Workflow[In],
        timing: Timing,
        input: In | Callable[[dt.datetime], In] | None,
        *,
        catch_up: str,
        catch_up_window: dt.timedelta | None,
        overlap: str,
    ) -> None:
        from cyclone._model.workflows import Workflow

        self.name = validate_name(name)
        if not isinstance(target, Kind | Workflow):
            raise InvalidScheduleError(
                f"a schedule's target must be a step, an action, a registered kind or a "
                f"workflow, got {target!r}"
            )
        self.target = target
        self.timing = timing
        self.catch_up_window = _check_policy(catch_up, catch_up_window, overlap)
        self.catch_up = catch_up
        self.overlap = overlap
        if input is None and not codec.accepts(None, target.input_type):
            raise InvalidScheduleError(
                f"input= is required: schedule {self.name!r} runs {target.name!r}, which takes "
                f"{codec.type_name(target.input_type)}; pass input=VALUE, or a function of the "
                "slot's time that returns it (input=lambda slot: ...)"
            )
        self.input = input
        self.input_fn: Callable[[dt.datetime], In] | None = input if callable(input) else None
        # A value input is checked now, so a bad one fails at declaration, not at each slot.
        self.encoded_input: str | None = None if self.input_fn is not None else self.encode(input)

    @property
    def job(self) -> bool:
        """Whether each slot makes a standalone job (else a workflow run)."""
        return isinstance(self.target, Kind)

    def encode(self, value: object) -> str:
        """``value`` encoded as the target's input."""
        return codec.encode(
            value,
            self.target.input_type,
            what=f"input of schedule {self.name!r}",
            limit=codec.DEFAULT_PAYLOAD_LIMIT,
        )

    def input_for(self, slot: dt.datetime) -> str:
        """The encoded input of the run of ``slot``: the value, or the function's result for
        the slot time (in the schedule's zone)."""
        if self.input_fn is None:
            assert self.encoded_input is not None
            return self.encoded_input
        return self.encode(self.input_fn(slot.astimezone(ZoneInfo(self.timing.tz))))

    def __repr__(self) -> str:
        return f"<cyclone.Schedule {self.name!r} {self.timing.describe()} -> {self.target.name!r}>"


def schedule(
    name: str,
    target: Kind[In, Any] | Workflow[In],
    *,
    cron: str | None = None,
    every: dt.timedelta | float | None = None,
    tz: str = "UTC",
    start: dt.datetime | None = None,
    input: In | Callable[[dt.datetime], In] | None = None,
    catch_up: str = "skip",
    catch_up_window: dt.timedelta | None = None,
    overlap: str = "allow",
) -> Schedule[In]:
    """Declare a schedule: one run of ``target`` per slot of ``cron=`` (in ``tz``) or of
    ``every=`` (from ``start``, default the Unix epoch).

    ``input`` is the run's input, or a function of the slot time that returns it.
    ``catch_up`` says what happens to slots missed while no worker ran: ``"skip"`` (default),
    ``"latest"`` (run the newest missed slot once) or ``"all"`` (every missed slot within
    ``catch_up_window``). ``overlap="skip"`` drops a slot while the schedule's previous run
    is still active. Checked here: bad input raises :class:`InvalidScheduleError`.
    """
    timing = Timing.parse(cron, every, tz, start)
    return Schedule(
        name,
        target,
        timing,
        input,
        catch_up=catch_up,
        catch_up_window=catch_up_window,
        overlap=overlap,
    )


def check_unique(schedules: list[Schedule[Any]]) -> dict[str, Schedule[Any]]:
    """The schedules by name; two with one name raise :class:`InvalidScheduleError`."""
    by_name: dict[str, Schedule[Any]] = {}
    for s in schedules:
        if not isinstance(s, Schedule):
            raise InvalidScheduleError(f"{s!r} is not a schedule from cyclone.schedule()")
        if s.name in by_name and by_name[s.name] is not s:
            raise InvalidScheduleError(f"two schedules are named {s.name!r}: rename one")
        by_name[s.name] = s
    return by_name
