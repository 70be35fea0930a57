"""The pages: overview, runs, one run; each with a ``live`` fragment that htmx refreshes.

Pages only read, through the client's public read models; every query is bounded (a page of
runs, a capped walk, one run, an hour of minutes).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import uuid
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from cyclone._client import Client
from cyclone._model.errors import RunNotFoundError
from cyclone._model.explain import Explanation
from cyclone._model.handles import Run, RunInfo, RunPayloads, RunState
from cyclone.web import _filters, _svg, _views
from cyclone.web._render import Renderer

THROUGHPUT_MINUTES = 60
PAGE_SIZE = 50


@dataclass(frozen=True, slots=True)
class Pages:
    """The read-only endpoints of one dashboard."""

    client: Client
    render: Renderer
    page_size: int = PAGE_SIZE

    # Overview

    async def overview(self, request: Request) -> Response:
        """Per queue: live counts, the oldest wait, completions and failures per minute."""
        return self.render.page(request, "overview.html", **await self.overview_context())

    async def overview_live(self, request: Request) -> Response:
        """The overview's refreshed part."""
        return self.render.page(request, "_overview_live.html", **await self.overview_context())

    async def overview_context(self) -> dict[str, Any]:
        """What the overview shows (also after a queue's pause or resume)."""
        stats = await self.client.stats()
        points = await self.client.throughput(minutes=THROUGHPUT_MINUTES)
        now = dt.datetime.now(dt.UTC)
        charts = {c.queue: c for c in _svg.charts(points, minutes=THROUGHPUT_MINUTES, now=now)}
        queues = sorted({s.queue for s in stats} | set(charts))
        return {
            "stats": {s.queue: s for s in stats},
            "charts": charts,
            "queues": queues,
            "minutes": THROUGHPUT_MINUTES,
            "now": now,
            "workers": await self.client.workers(),
        }

    # Schedules

    async def schedules(self, request: Request) -> Response:
        """Every stored schedule: timing, target, state, next slot and newest run."""
        return self.render.page(request, "schedules.html", **await self.schedules_context())

    async def schedules_live(self, request: Request) -> Response:
        """The schedules table, refreshed."""
        return self.render.page(request, "_schedules_live.html", **await self.schedules_context())

    async def schedules_context(self, flash: dict[str, Any] | None = None) -> dict[str, Any]:
        """What the schedules page shows, with an action's outcome on top (``flash``)."""
        return {"schedules": await self.client.schedules.list(), "flash": flash}

    # Runs

    async def runs(self, request: Request) -> Response:
        """Runs matching the filters, newest first; a run id in ``q`` opens that run."""
        search = request.query_params.get("q", "").strip()
        if search:
            run_id = _filters.run_id(search)
            await self.client.get_run(run_id)  # 404 when there is no such run
            return RedirectResponse(f"{request.scope.get('root_path') or ''}/runs/{run_id}", 303)
        return self.render.page(request, "runs.html", **await self._runs(request))

    async def runs_live(self, request: Request) -> Response:
        """The runs table, refreshed."""
        return self.render.page(request, "_runs_live.html", **await self._runs(request))

    async def _runs(self, request: Request) -> dict[str, Any]:
        filters = _filters.parse(request.query_params)
        cursor = _filters.cursor(request.query_params)
        page = await self.client.list_runs(filters.page(limit=self.page_size, cursor=cursor))
        return {
            "filters": filters,
            "page": page,
            "cursor": cursor,
            "scan": _filters.SCAN,
            "states": [s.value for s in RunState],
        }

    # One run

    async def run(self, request: Request) -> Response:
        """One run: state, payloads, nodes with their errors, the DAG, actions."""
        return self.render.page(request, "run.html", **await self.run_context(request))

    async def run_live(self, request: Request) -> Response:
        """The run page's refreshed part."""
        return self.render.page(request, "_run_live.html", **await self.run_context(request))

    async def run_context(self, request: Request, **extra: Any) -> dict[str, Any]:
        """What the run templates show (``extra``: a flash message after an action)."""
        run_id = _filters.path_run_id(request)
        return {**await run_view(self.client, run_id), "flash": None, **extra}


async def run_view(client: Client, run_id: uuid.UUID) -> dict[str, Any]:
    """A run's info, payloads and drawing; :class:`RunNotFoundError` when it is gone."""
    run = Run(client, run_id)
    info: RunInfo = await run.info()
    try:
        payloads: RunPayloads | None = await run.payloads()
    except RunNotFoundError:  # purged between the two reads
        payloads = None
    # Why a run that has not ended is where it is: a reason per open node.
    explanation: Explanation | None = None
    if not info.state.terminal:
        with contextlib.suppress(RunNotFoundError):  # purged meanwhile
            explanation = await client.explain(run_id)
    # A wait node takes a signal (kept until the node is reached) unless its run completed or
    # was cancelled: a failed run keeps it for after a retry.
    waits = [
        n.name
        for n in info.nodes
        if info.state not in (RunState.COMPLETED, RunState.CANCELLED)
        and n.kind is None
        and payloads is not None
        and n.name in payloads.nodes
        and not payloads.nodes[n.name].signalled
    ]
    return {
        "info": info,
        "payloads": payloads,
        "dag": _svg.dag(info.nodes, info.edges),
        "wait_nodes": waits,
        "actions": _views.run_actions(info),
        "failure": _views.failure(info),
        "attempts": _views.attempts(info.nodes),
        "output_note": None if payloads is None else _views.no_output(info, payloads),
        "explanation": explanation,
        # The key of a fork from this page: a form sent twice (a retried POST) forks once.
        "fork_key": f"dashboard:{uuid.uuid4().hex}",
    }
