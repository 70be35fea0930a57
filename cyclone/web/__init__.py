"""The dashboard: see and steer runs in a browser (``pip install 'cyclone-pg[web]'``).

An ASGI app (Starlette, server-rendered Jinja2 templates, a vendored htmx) on the client's
own pool and public API. Mount it in FastAPI or Starlette behind the host's auth::

    app.mount("/jobs", cyclone.web.dashboard(client, authorize=is_admin))

or run it alone with ``cyclone dashboard --dsn ... --bind 127.0.0.1:8080``. See
:func:`dashboard` for the access rules (read-only by default where nobody vouches for the
requests; CSRF tokens on every action).
"""

from __future__ import annotations

try:
    import jinja2  # noqa: F401
    import starlette  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the install
    raise ImportError("cyclone.web needs its extra: pip install 'cyclone-pg[web]'") from exc

from cyclone.web._app import dashboard

__all__ = ["dashboard"]
