"""The dashboard's ASGI app: routes, access checks and error pages."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles

from cyclone._client import Client
from cyclone._model.errors import InvalidInputError, InvalidOptionError, RunNotFoundError
from cyclone.web import _live, _stream
from cyclone.web._actions import Actions
from cyclone.web._filters import BadRequest
from cyclone.web._pages import PAGE_SIZE, Pages
from cyclone.web._render import Renderer
from cyclone.web._security import Authorize, Guard

Endpoint = Callable[[Request], Awaitable[Response]]
STATIC = Path(__file__).parent / "static"


def dashboard(
    client: Client,
    *,
    authorize: Authorize | None = None,
    read_only: bool | None = None,
    secret: str | bytes | None = None,
    title: str = "Cyclone",
    page_size: int = PAGE_SIZE,
) -> Starlette:
    """The dashboard as an ASGI app on ``client``'s pool: mount it, or serve it with uvicorn.

    ``app.mount("/jobs", cyclone.web.dashboard(client, authorize=is_admin))`` in FastAPI or
    Starlette. ``authorize(request)`` (sync or async) runs before every request: return True
    to allow it, False to answer 403, or raise ``HTTPException`` (401 with a challenge, say).
    ``read_only=True`` serves no action endpoints at all; ``False`` serves them; ``None``
    (the default) serves them when ``authorize`` is given, or else only to requests that came
    in on a loopback address without a proxy's forwarding header. ``secret`` signs the CSRF
    tokens (give the same one to every process behind a load balancer; by default each app
    makes its own). ``page_size`` is the runs per page.
    """
    if not isinstance(client, Client):
        raise InvalidInputError(f"dashboard needs a cyclone.Client, got {type(client).__name__}")
    if isinstance(page_size, bool) or not isinstance(page_size, int) or not 1 <= page_size <= 500:
        raise InvalidOptionError(f"page_size must be an int from 1 to 500, got {page_size!r}")
    guard = Guard.make(authorize, read_only, secret)
    render = Renderer(guard, title)
    pages = Pages(client, render, page_size)
    actions = Actions(client, render, pages)

    def page(endpoint: Endpoint) -> Endpoint:
        async def guarded(request: Request) -> Response:
            await guard.check(request)
            try:
                return await endpoint(request)
            except BadRequest as exc:
                return render.error(request, 400, str(exc))
            except RunNotFoundError as exc:
                return render.error(
                    request, 404, f"{exc}: it may not be committed yet, or it was purged"
                )

        return guarded

    def action(endpoint: Endpoint) -> Endpoint:
        async def checked(request: Request) -> Response:
            if not guard.writable(request):
                raise HTTPException(404, "this dashboard is read-only")
            await guard.verify(request)
            return await endpoint(request)

        return page(checked)

    async def events(request: Request) -> Response:
        return _live.events(client)

    async def run_stream(request: Request) -> Response:
        return await _stream.events(client, request)

    routes: list[BaseRoute] = [
        Route("/", page(pages.overview)),
        Route("/overview/live", page(pages.overview_live)),
        Route("/runs", page(pages.runs)),
        Route("/runs/live", page(pages.runs_live)),
        Route("/schedules", page(pages.schedules)),
        Route("/schedules/live", page(pages.schedules_live)),
    ]
    if read_only is not True:
        routes += [
            Route("/runs/bulk", page(action_page(guard, actions.bulk_confirm))),
            Route("/runs/bulk", action(actions.bulk), methods=["POST"]),
            Route("/runs/{run_id}/retry", action(actions.retry), methods=["POST"]),
            Route("/runs/{run_id}/cancel", action(actions.cancel), methods=["POST"]),
            Route("/runs/{run_id}/signal", action(actions.signal), methods=["POST"]),
            Route("/runs/{run_id}/fork", action(actions.fork), methods=["POST"]),
            *(
                Route(f"/schedules/{{name}}/{verb}", action(endpoint), methods=["POST"])
                for verb, endpoint in actions.schedule_verbs().items()
            ),
            Route("/queues/{queue}/pause", action(actions.queue_pause), methods=["POST"]),
            Route("/queues/{queue}/resume", action(actions.queue_resume), methods=["POST"]),
        ]
    routes += [
        Route("/runs/{run_id}", page(pages.run)),
        Route("/runs/{run_id}/live", page(pages.run_live)),
        Route("/runs/{run_id}/stream", page(run_stream)),
        Route("/events", page(events)),
        Mount("/static", StaticFiles(directory=STATIC), name="static"),
    ]

    async def error_page(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        response = render.error(request, exc.status_code, exc.detail)
        response.headers.update(exc.headers or {})
        return response

    return Starlette(routes=routes, exception_handlers={HTTPException: error_page})


def action_page(guard: Guard, endpoint: Endpoint) -> Endpoint:
    """A page that only leads to an action (the bulk confirmation): absent when read-only."""

    async def shown(request: Request) -> Response:
        if not guard.writable(request):
            raise HTTPException(404, "this dashboard is read-only")
        return await endpoint(request)

    return shown
