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


def ago(seconds: float | None) -> str:
    """A duration such as ``42s``, ``5m 3s``, ``2h 10m``, ``3d 4h``."""
    if seconds is None:
        return ""
    s = int(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m {s % 60}s"
    if s < 86400:
        return f"{s // 3600}h {s % 3600 // 60}m"
    return f"{s // 86400}d {s % 86400 // 3600}h"


def _environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("cyclone.web", "templates"),
        autoescape=True,  # every template, whatever its name
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters.update(pretty=pretty, when=when, ago=ago)
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
