"""Slot arithmetic, catch-up planning, DST and declaration checks: pure, time as a parameter."""

from __future__ import annotations

import datetime as dt
from zoneinfo import ZoneInfo

import pytest

import cyclone
from cyclone._model.schedules import slot_key
from cyclone._model.timing import GRACE, MAX_CATCH_UP, Timing, plan

UTC = dt.UTC
PARIS = ZoneInfo("Europe/Paris")


@cyclone.action("slots.job")
async def job(ctx: cyclone.Context, n: int) -> None:
    return None


def at(*args: int, tz: dt.tzinfo = UTC) -> dt.datetime:
    return dt.datetime(*args, tzinfo=tz)  # type: ignore[misc]


def local_slots(timing: Timing, start: dt.datetime, end: dt.datetime) -> list[str]:
    return [s.astimezone(PARIS).isoformat() for s in timing.slots(start, end)]


def test_every_slots_are_anchored_at_the_epoch_or_start() -> None:
    t = Timing.parse(None, dt.timedelta(minutes=15), "UTC", None)
    assert t.next_after(at(2024, 1, 1, 10, 7)) == at(2024, 1, 1, 10, 15)
    assert t.next_after(at(2024, 1, 1, 10, 15)) == at(2024, 1, 1, 10, 30)  # strictly after
    anchored = Timing.parse(None, 900, "UTC", at(2024, 1, 1, 0, 5))
    assert anchored.next_after(at(2024, 1, 1, 10, 7)) == at(2024, 1, 1, 10, 20)


def test_cron_aliases_and_zone() -> None:
    t = Timing.parse("@daily", None, "Europe/Paris", None)
    assert t.next_after(at(2024, 6, 1, 12)) == at(2024, 6, 1, 22)  # midnight in Paris, UTC+2
    assert Timing.parse("@hourly", None, "UTC", None).next_after(at(2024, 1, 1, 3, 1)) == at(
        2024, 1, 1, 4
    )


def test_dst_forward_a_skipped_fixed_time_fires_once_at_the_next_valid_time() -> None:
    # 2024-03-31 in Paris: 02:00 local jumps to 03:00; 02:30 does not exist that night.
    t = Timing.parse("30 2 * * *", None, "Europe/Paris", None)
    slots = local_slots(t, at(2024, 3, 29, 12), at(2024, 4, 2, 12))
    assert slots == [
        "2024-03-30T02:30:00+01:00",
        "2024-03-31T03:00:00+02:00",
        "2024-04-01T02:30:00+02:00",
        "2024-04-02T02:30:00+02:00",
    ]


def test_dst_back_a_repeated_fixed_time_fires_once() -> None:
    # 2024-10-27 in Paris: 03:00 local goes back to 02:00; 02:30 happens twice.
    t = Timing.parse("30 2 * * *", None, "Europe/Paris", None)
    slots = local_slots(t, at(2024, 10, 25, 12), at(2024, 10, 28, 12))
    assert slots == [
        "2024-10-26T02:30:00+02:00",
        "2024-10-27T02:30:00+02:00",
        "2024-10-28T02:30:00+01:00",
    ]


def test_dst_hourly_keeps_real_time_spacing() -> None:
    t = Timing.parse("30 * * * *", None, "Europe/Paris", None)
    forward = local_slots(t, at(2024, 3, 30, 23, 45), at(2024, 3, 31, 2, 45))
    assert forward == [
        "2024-03-31T01:30:00+01:00",
        "2024-03-31T03:30:00+02:00",
        "2024-03-31T04:30:00+02:00",
    ]
    back = local_slots(t, at(2024, 10, 26, 23, 45), at(2024, 10, 27, 2, 45))
    assert back == [
        "2024-10-27T02:30:00+02:00",
        "2024-10-27T02:30:00+01:00",
        "2024-10-27T03:30:00+01:00",
    ]


EVERY = Timing.parse(None, dt.timedelta(seconds=1), "UTC", None)
NOW = at(2024, 1, 1, 12, 0, 30)


def fire(catch_up: str, missed: float, window: dt.timedelta | None = None) -> list[float]:
    p = plan(
        EVERY,
        catch_up=catch_up,
        window=window,
        overlap_blocked=False,
        next_at=NOW - dt.timedelta(seconds=missed),
        now=NOW,
    )
    assert p.next_at == NOW + dt.timedelta(seconds=1)
    return [(NOW - s).total_seconds() for s in p.fire]


def test_on_time_and_slightly_late_slots_always_fire() -> None:
    assert fire("skip", 0) == [0]
    assert fire("skip", 3) == [3, 2, 1, 0]  # within GRACE: late, not missed


def test_catch_up_skip_drops_missed_slots() -> None:
    lag = GRACE.total_seconds()
    assert fire("skip", 60) == [lag - i for i in range(int(lag) + 1)]


def test_catch_up_latest_runs_the_newest_missed_slot_once() -> None:
    lag = GRACE.total_seconds()
    assert fire("latest", 60) == [lag + 1] + [lag - i for i in range(int(lag) + 1)]


def test_catch_up_all_runs_every_slot_in_the_window_and_never_more_than_the_cap() -> None:
    assert fire("all", 60, dt.timedelta(seconds=20)) == [20 - i for i in range(21)]
    burst = fire("all", 10**6, dt.timedelta(days=30))
    assert len(burst) == MAX_CATCH_UP and burst[-1] == 0  # the newest are kept


def test_overlap_blocked_fires_nothing_and_moves_on() -> None:
    p = plan(EVERY, catch_up="skip", window=None, overlap_blocked=True, next_at=NOW, now=NOW)
    assert p.fire == [] and p.next_at > NOW and p.missed_from == NOW


def test_not_due_yet_changes_nothing() -> None:
    later = NOW + dt.timedelta(seconds=5)
    p = plan(EVERY, catch_up="skip", window=None, overlap_blocked=False, next_at=later, now=NOW)
    assert p.fire == [] and p.next_at == later


def test_slot_keys_are_iso_utc() -> None:
    assert slot_key("a.b", at(2024, 3, 31, 3, tz=PARIS)) == "schedule:a.b:2024-03-31T01:00:00Z"
    assert slot_key("a", at(2024, 1, 1, 0, 0, 0, 5000)) == "schedule:a:2024-01-01T00:00:00.005000Z"


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"cron": "61 * * * *"}, "invalid cron expression '61 * * * *'"),
        ({"cron": "* * *"}, "it needs 5 fields"),
        ({"cron": "0 0 0 * * *"}, "it needs 5 fields"),
        ({"cron": "@fortnightly"}, "unknown cron alias '@fortnightly'"),
        ({"cron": "0 3 * * *", "tz": "Mars/Olympus"}, "unknown time zone 'Mars/Olympus'"),
        ({"every": dt.timedelta(0)}, "every= must be a positive interval"),
        ({"every": -5}, "every= must be a positive interval"),
        ({}, "exactly one of cron= or every="),
        ({"cron": "0 3 * * *", "every": 60}, "exactly one of cron= or every="),
        ({"every": 60, "start": dt.datetime(2024, 1, 1)}, "start must be timezone-aware"),
        ({"every": 60, "catch_up": "burst"}, "unknown catch_up policy 'burst'"),
        ({"every": 60, "catch_up": "all"}, "catch_up='all' needs catch_up_window="),
        ({"every": 60, "overlap": "queue"}, "unknown overlap policy 'queue'"),
    ],
)
def test_bad_declarations_are_refused(options: dict[str, object], message: str) -> None:
    options.setdefault("input", 1)
    with pytest.raises(cyclone.InvalidScheduleError, match=message.replace("*", r"\*")):
        cyclone.schedule("bad", job, **options)  # type: ignore[arg-type]


def test_a_value_input_is_checked_against_the_target_at_declaration() -> None:
    with pytest.raises(cyclone.InvalidInputError, match="input of schedule 'bad' must be int"):
        cyclone.schedule("bad", job, every=60, input="not an int")


def test_bad_names_and_targets_are_refused() -> None:
    with pytest.raises(cyclone.InvalidScheduleError, match="schedule name"):
        cyclone.schedule("has space", job, every=60, input=1)
    with pytest.raises(cyclone.InvalidScheduleError, match="target must be"):
        cyclone.schedule("x", print, every=60, input=1)  # type: ignore[arg-type]


def test_invalid_schedule_error_is_an_invalid_input_error() -> None:
    assert issubclass(cyclone.InvalidScheduleError, cyclone.InvalidInputError)
