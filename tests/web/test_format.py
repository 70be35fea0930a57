"""How the dashboard writes times, durations and run ids (no database)."""

from __future__ import annotations

import datetime as dt
import uuid

import pytest

from cyclone.web._render import duration, iso, short_id, since, took
from cyclone.web._views import stored_time

NOW = dt.datetime(2025, 3, 1, 12, 0, tzinfo=dt.UTC)


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0, "just now"),
        (-3, "just now"),  # the database's clock a little ahead of the app's
        (42, "42 s ago"),
        (3 * 60 + 59, "3 min ago"),
        (5 * 3600, "5 h ago"),
        (12 * 86400, "12 d ago"),
        (-180, "in 3 min"),
        (45 * 86400, "2025-01-15"),
    ],
)
def test_since(seconds: float, text: str) -> None:
    assert since(NOW - dt.timedelta(seconds=seconds), NOW) == text


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0.0123, "12 ms"),
        (4.25, "4.2 s"),
        (42.9, "42 s"),
        (303, "5 min 3 s"),
        (2 * 3600 + 600, "2 h 10 min"),
        (3 * 86400 + 4 * 3600, "3 d 4 h"),
        (None, ""),
    ],
)
def test_duration(seconds: float | None, text: str) -> None:
    assert duration(seconds) == text


def test_times_and_ids() -> None:
    later = NOW + dt.timedelta(seconds=1.5)
    assert took(NOW, later) == "1.5 s" and took(NOW, None) == ""
    paris = dt.timezone(dt.timedelta(hours=1))
    assert iso(dt.datetime(2025, 3, 1, 13, 0, 0, 123456, tzinfo=paris)) == (
        "2025-03-01T12:00:00.123Z"
    )
    run_id = uuid.UUID("01a23b09-e246-7440-961b-83f479e73185")
    assert short_id(run_id) == "…79e73185"
    assert stored_time("2025-03-01T12:00:00.5+00:00") == NOW + dt.timedelta(seconds=0.5)
    assert stored_time("yesterday") is None and stored_time(None) is None
