"""Templates and their helpers: Jinja2 with autoescaping on for every template, values from
the database shown as text (JSON pretty-printed into ``<pre>``), strict response headers."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import jinja2
from starlette.requests import Request
from starlette.responses import HTMLResponse

from cyclone.web._security import Guard, set_cookie

LARGE_JSON = 2_000
"""Pretty JSON longer than this many characters starts collapsed."""

# No inline script and no eval: htmx is configured (allowEval false) not to need them, so a
# value that slipped past escaping still could not run.
HEADERS = {
    "Content-Security-Policy": (
        "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:;"
        " connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'"
    ),
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}


def pretty(value: Any) -> str:
    """A JSON value as indented text."""
    return json.dumps(value, indent=2, ensure_ascii=False, sort_keys=False, default=str)


def when(value: dt.datetime | None) -> str:
    """A timestamp in UTC, to the second."""
    if value is None:
        return ""
    return value.astimezone(dt.UTC).strftime("%Y-%m-%d %H:%M:%S")


def iso(value: dt.datetime) -> str:
    """A timestamp as ISO 8601 in UTC, to the millisecond: for ``<time datetime>``."""
    return value.astimezone(dt.UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def since(value: dt.datetime, now: dt.datetime) -> str:
    """How long before ``now`` ``value`` was, in its largest unit: ``just now``,
    ``42 s ago``, ``3 min ago``, ``5 h ago``, ``12 d ago``; ``in 3 min`` for a time still
    to come; the date for a time more than 30 days away."""
    seconds = (now - value).total_seconds()
    # The database's clock and the app's differ a little: a few seconds either way is now.
    if abs(seconds) < 5:
        return "just now"
    s = int(abs(seconds))
    if s >= 30 * 86400:
        return value.astimezone(dt.UTC).strftime("%Y-%m-%d")
    if s < 60:
        span = f"{s} s"
    elif s < 3600:
        span = f"{s // 60} min"
    elif s < 86400:
        span = f"{s // 3600} h"
    else:
        span = f"{s // 86400} d"
    return f"{span} ago" if seconds > 0 else f"in {span}"


def duration(seconds: float | None) -> str:
    """A duration such as ``850 ms``, ``4.2 s``, ``42 s``, ``5 min 3 s``, ``2 h 10 min``,
    ``3 d 4 h``."""
    if seconds is None:
        return ""
    if seconds < 1:
        return f"{max(seconds, 0) * 1000:.0f} ms"
    if seconds < 10:
        return f"{seconds:.1f} s"
    s = int(seconds)
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60} s"
    if s < 86400:
        return f"{s // 3600} h {s % 3600 // 60} min"
    return f"{s // 86400} d {s % 86400 // 3600} h"


def took(start: dt.datetime, end: dt.datetime | None) -> str:
    """The time from ``start`` to ``end`` as a :func:`duration` ("" when there is no end)."""
    return "" if end is None else duration((end - start).total_seconds())


def short_id(value: object) -> str:
    """A run id's last 8 characters: its random part, which tells apart the runs of a page
    (a time-ordered id starts with its creation time, the same for every run of a minute)."""
    return f"…{str(value)[-8:]}"


def _environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("cyclone.web", "templates"),
        autoescape=True,  # every template, whatever its name
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters.update(
        pretty=pretty,
        when=when,
        iso=iso,
        since=since,
        duration=duration,
        took=took,
        short_id=short_id,
    )
    env.globals.update(LARGE_JSON=LARGE_JSON)
    return env


ENV = _environment()


class Renderer:
    """Renders pages for one dashboard: its title and guard are in every template."""

    def __init__(self, guard: Guard, title: str) -> None:
        self.guard = guard
        self.title = title

    def page(
        self, request: Request, template: str, status: int = 200, **context: Any
    ) -> HTMLResponse:
        """Render ``template`` with the common context; sets the CSRF cookie when new."""
        token, fresh = self.guard.token(request)
        # Relative times ("3 min ago") count from one instant for the whole page.
        context.setdefault("now", dt.datetime.now(dt.UTC))
        html = ENV.get_template(template).render(
            base=request.scope.get("root_path") or "",
            title=self.title,
            csrf=token,
            writable=self.guard.writable(request),
            **context,
        )
        response = HTMLResponse(html, status_code=status, headers=HEADERS)
        if fresh is not None:
            set_cookie(response, request, fresh)
        return response

    def error(self, request: Request, code: int, message: str) -> HTMLResponse:
        """An error page (for htmx, an error box in place of the refreshed part)."""
        partial = request.headers.get("hx-request") == "true"
        template = "_error_live.html" if partial else "error.html"
        return self.page(request, template, code, code=code, message=message)
