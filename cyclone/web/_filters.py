"""The runs page's filters: query parameters in, a checked :class:`cyclone.RunQuery` out.

A filter that cannot be used raises :class:`BadRequest`, which the app answers with a 400
page stating what was wrong and what to write instead.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, replace
from urllib.parse import urlencode

from starlette.exceptions import HTTPException
from starlette.requests import Request

from cyclone._model.handles import RunQuery, RunState

FIELDS = ("name", "state", "key", "queue", "after", "before")
MAX_TEXT = 256
SCAN = 5_000
"""Runs a page may read to fill itself; a rare filter then pages through the history."""


class BadRequest(Exception):
    """A request the dashboard cannot serve as asked: answered with a 400 and this message."""


@dataclass(frozen=True, slots=True)
class Filters:
    """The runs page's filters as typed; ``values`` is what the form shows back."""

    query: RunQuery
    values: dict[str, str]

    def link(self, **changes: str | None) -> str:
        """The query string of these filters with ``changes`` (None drops a parameter)."""
        params = {**self.values, **changes}
        return urlencode({k: v for k, v in params.items() if v})

    def page(self, *, limit: int, cursor: str | None) -> RunQuery:
        """This filter's query for one page."""
        return replace(self.query, limit=limit, cursor=cursor)


def _text(params: Mapping[str, str], name: str) -> str | None:
    value = params.get(name, "").strip()
    if len(value) > MAX_TEXT:
        raise BadRequest(f"the {name} filter is longer than {MAX_TEXT} characters")
    if "\x00" in value:
        raise BadRequest(f"the {name} filter contains a NUL character")
    return value or None


def _time(params: Mapping[str, str], name: str) -> dt.datetime | None:
    value = _text(params, name)
    if value is None:
        return None
    try:
        parsed = dt.datetime.fromisoformat(value)
    except ValueError:
        raise BadRequest(
            f"the {name} filter {value!r} is not a date and time: write it like"
            " 2025-01-31T14:05 (UTC unless it carries an offset such as +02:00)"
        ) from None
    return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=dt.UTC)


def parse(params: Mapping[str, str]) -> Filters:
    """The filters in a runs page's query parameters."""
    values = {name: v for name in FIELDS if (v := params.get(name, "").strip())}
    state = _text(params, "state")
    if state is not None and state not in {s.value for s in RunState}:
        choices = ", ".join(s.value for s in RunState)
        raise BadRequest(f"the state filter {state!r} is not a run state: use one of {choices}")
    after, before = _time(params, "after"), _time(params, "before")
    if after is not None and before is not None and after >= before:
        raise BadRequest("the after filter must be earlier than the before filter")
    query = RunQuery(
        name=_text(params, "name"),
        state=None if state is None else RunState(state),
        key=_text(params, "key"),
        queue=_text(params, "queue"),
        created_after=after,
        created_before=before,
        scan=SCAN,
    )
    return Filters(query=query, values=values)


def cursor(params: Mapping[str, str]) -> str | None:
    """The page cursor, checked to be one that the runs page made."""
    value = params.get("cursor", "").strip()
    if not value:
        return None
    try:
        uuid.UUID(value)
    except ValueError:
        raise BadRequest(
            f"the cursor {value[:64]!r} is not one this page made: follow the page links"
        ) from None
    return value


def path_run_id(request: Request) -> uuid.UUID:
    """The run id in a page's path; a 404 when it is not one (no such page)."""
    try:
        return run_id(request.path_params["run_id"])
    except BadRequest as exc:
        raise HTTPException(404, str(exc)) from None


def run_id(text: str) -> uuid.UUID:
    """A run id from a path or form; BadRequest if it is not one."""
    try:
        return uuid.UUID(text.strip())
    except ValueError:
        raise BadRequest(
            f"{text[:64]!r} is not a run id: a run id looks like"
            " 0192f1c4-7a3e-7b2c-9d41-5e6f7a8b9c0d"
        ) from None
