"""The actions: retry_all, retry(node), cancel, signal, fork, and bulk retry/cancel/fork.

Each goes through the same client call as the API (``run.retry_all()``, ``run.retry(node)``,
``run.cancel()``, ``client.signal(...)``, ``client.fork(...)``), so a click can do nothing the
API would refuse: the API's error is what the page shows. The app checks access and the CSRF
token before any of these runs. A bulk action names its runs (at most ``BULK_MAX``): the
confirmation page resolves a filter to ids and states their count, and the action touches
exactly those.
"""

from __future__ import annotations

import functools
import json
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace

import msgspec
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from cyclone._client import Client
from cyclone._model.errors import (
    CycloneError,
    InvalidInputError,
    PayloadTooLargeError,
    UnknownNodeError,
    UnknownQueueError,
)
from cyclone._model.handles import Run
from cyclone.web import _filters
from cyclone.web._filters import BadRequest
from cyclone.web._pages import Pages
from cyclone.web._render import Renderer
from cyclone.web._security import read_form

BULK_MAX = 1_000
ACTIONS = {"retry": "Retry", "cancel": "Cancel", "fork": "Fork"}


@dataclass(slots=True)
class Outcome:
    """What a bulk action did, run by run."""

    action: str
    done: list[uuid.UUID] = field(default_factory=list)
    unchanged: list[uuid.UUID] = field(default_factory=list)
    refused: list[tuple[uuid.UUID, str]] = field(default_factory=list)
    forks: list[uuid.UUID] = field(default_factory=list)  # a fork's, one per run done


def _one(form: dict[str, list[str]], name: str) -> str:
    values = form.get(name, [])
    return values[0] if values else ""


def _action(value: str) -> str:
    if value not in ACTIONS:
        raise BadRequest(f"unknown bulk action {value[:32]!r}: use retry, cancel or fork")
    return value


@dataclass(frozen=True, slots=True)
class Actions:
    """The action endpoints of one dashboard."""

    client: Client
    render: Renderer
    pages: Pages

    def schedule_verbs(self) -> dict[str, Callable[[Request], Awaitable[Response]]]:
        """The schedule actions by the verb that ends their path."""
        return {
            verb: functools.partial(self.schedule, verb=verb)
            for verb in ("pause", "resume", "trigger")
        }

    async def schedule(self, request: Request, *, verb: str) -> Response:
        """``client.schedules.pause/resume/trigger(name)`` for the path's schedule."""
        name = request.path_params["name"]
        schedules = self.client.schedules
        try:
            if verb == "pause":
                await schedules.pause(name)
                flash = {"text": f"Schedule {name!r} paused.", "error": False}
            elif verb == "resume":
                await schedules.resume(name)
                flash = {"text": f"Schedule {name!r} resumes at its next slot.", "error": False}
            else:
                key = await schedules.trigger(name)
                flash = {"text": f"Schedule {name!r} triggered: run key {key}.", "error": False}
        except CycloneError as exc:
            flash = {"text": f"Not done: {exc}", "error": True}
        context = await self.pages.schedules_context(flash)
        template = "_schedules_live.html" if request.headers.get("hx-request") else "schedules.html"
        return self.render.page(request, template, 409 if flash["error"] else 200, **context)

    async def _after(
        self, request: Request, message: str, *, error: bool, status: int = 409
    ) -> Response:
        """The run page (or, for htmx, its live part) with the action's outcome on top:
        ``status`` when the action was refused, else 200."""
        flash = {"text": message, "error": error}
        context = await self.pages.run_context(request, flash=flash)
        template = "_run_live.html" if request.headers.get("hx-request") else "run.html"
        return self.render.page(request, template, status if error else 200, **context)

    async def retry(self, request: Request) -> Response:
        """``run.retry_all()``, or ``run.retry(node)`` when the form names a node."""
        run = Run(self.client, _filters.path_run_id(request))
        node = _one(await read_form(request), "node").strip()
        try:
            if node:
                await run.retry(node)
            else:
                await run.retry_all()
        except CycloneError as exc:
            return await self._after(request, f"Not retried: {exc}", error=True)
        done = f"Node {node!r} reset" if node else "Failed nodes reset"
        return await self._after(request, f"{done}: the run is open again.", error=False)

    async def cancel(self, request: Request) -> Response:
        """``run.cancel()``."""
        run = Run(self.client, _filters.path_run_id(request))
        try:
            cancelled = await run.cancel()
        except CycloneError as exc:
            return await self._after(request, f"Not cancelled: {exc}", error=True)
        if not cancelled:
            return await self._after(
                request,
                "Not cancelled: the run had already completed or been cancelled.",
                error=True,
            )
        return await self._after(request, "Run cancelled.", error=False)

    async def signal(self, request: Request) -> Response:
        """``client.signal(run_id, node, payload, event=...)`` with the form's JSON payload
        (and event, for a node waiting for events)."""
        run_id = _filters.path_run_id(request)
        form = await read_form(request)
        node = _one(form, "node").strip()
        if not node:
            return await self._after(
                request, "Not signalled: name the wait node.", error=True, status=400
            )
        text = _one(form, "payload").strip() or "null"
        event = _one(form, "event").strip() or None
        try:
            json.loads(text)
        except json.JSONDecodeError as exc:
            message = f'Not signalled: the payload is not JSON ({exc}); write e.g. {{"ok": true}}'
            return await self._after(request, message, error=True, status=400)
        try:  # as JSON text: checked against the node's type, which may be a Struct
            await self.client.signal(run_id, node, msgspec.Raw(text.encode()), event=event)
        except (InvalidInputError, PayloadTooLargeError) as exc:
            return await self._after(request, f"Not signalled: {exc}", error=True, status=400)
        except CycloneError as exc:
            return await self._after(request, f"Not signalled: {exc}", error=True)
        return await self._after(request, f"Signalled {node!r}.", error=False)

    async def fork(self, request: Request) -> Response:
        """``client.fork(run, from_node=..., key=...)``, then the fork's page: the form's key
        makes a form sent twice fork once."""
        run_id = _filters.path_run_id(request)
        form = await read_form(request)
        node = _one(form, "from_node").strip()
        if not node:
            return await self._after(request, "Not forked: name the node.", error=True, status=400)
        try:
            fork = await self.client.fork(run_id, from_node=node, key=_one(form, "key") or None)
        except (InvalidInputError, UnknownNodeError) as exc:
            return await self._after(request, f"Not forked: {exc}", error=True, status=400)
        except CycloneError as exc:
            return await self._after(request, f"Not forked: {exc}", error=True)
        return RedirectResponse(f"{request.scope.get('root_path') or ''}/runs/{fork.id}", 303)

    async def bulk_confirm(self, request: Request) -> Response:
        """State what a bulk action would touch: the selected runs, or the runs matching a
        filter (at most ``BULK_MAX``, newest first); the form carries their ids."""
        params = request.query_params
        action = _action(params.get("action", ""))
        scope = params.get("scope", "")
        more = False
        filters = None
        if scope == "selected":
            selected = params.getlist("id")
            if not selected:
                raise BadRequest("no runs selected: tick the runs to act on, then choose")
            if len(selected) > BULK_MAX:
                raise BadRequest(f"select at most {BULK_MAX} runs for one bulk action")
            ids = list(dict.fromkeys(_filters.run_id(i) for i in selected))
        elif scope == "filter":
            filters = _filters.parse(params)
            # The whole history, not the page's bounded walk: this runs once per click.
            query = replace(filters.page(limit=BULK_MAX, cursor=None), scan=None)
            page = await self.client.list_runs(query)
            ids = [r.id for r in page.runs]
            more = page.next_cursor is not None
        else:
            raise BadRequest("say which runs: scope=selected (with ids) or scope=filter")
        return self.render.page(
            request,
            "bulk_confirm.html",
            action=action,
            verb=ACTIONS[action],
            ids=ids,
            more=more,
            filters=filters,
            bulk_max=BULK_MAX,
            fork_key=f"dashboard:{uuid.uuid4().hex}",
        )

    async def bulk(self, request: Request) -> Response:
        """Retry (``retry_all``), cancel or fork (from the form's node) each named run;
        report what each did."""
        form = await read_form(request)
        action = _action(_one(form, "action"))
        raw = form.get("id", [])
        if not raw:
            raise BadRequest("no runs named: choose runs on the runs page first")
        if len(raw) > BULK_MAX:
            raise BadRequest(f"a bulk action takes at most {BULK_MAX} runs")
        node = _one(form, "from_node").strip()
        if action == "fork" and not node:
            raise BadRequest("name the node to fork the runs from")
        outcome = Outcome(action=action)
        for run_id in dict.fromkeys(_filters.run_id(i) for i in raw):
            run = Run(self.client, run_id)
            try:
                if action == "fork":  # one key per run: a form sent twice forks each once
                    key = f"{_one(form, 'key')}:{run_id}" if _one(form, "key") else None
                    fork = await self.client.fork(run, from_node=node, key=key)
                    outcome.done.append(run_id)
                    outcome.forks.append(fork.id)
                elif action == "retry":
                    await run.retry_all()
                    outcome.done.append(run_id)
                elif await run.cancel():
                    outcome.done.append(run_id)
                else:
                    outcome.unchanged.append(run_id)
            except CycloneError as exc:
                outcome.refused.append((run_id, str(exc)))
        return self.render.page(request, "bulk_done.html", outcome=outcome, verb=ACTIONS[action])

    # Flow control from the overview (docs/flow-control.md).

    async def queue_pause(self, request: Request) -> Response:
        """``client.queues.pause(queue)``, creating the setting of a queue the overview
        lists."""
        return await self._queue(request, pause=True)

    async def queue_resume(self, request: Request) -> Response:
        """``client.queues.resume(queue)``, likewise."""
        return await self._queue(request, pause=False)

    async def _queue(self, request: Request, *, pause: bool) -> Response:
        queue = request.path_params["queue"]
        verb = "paused" if pause else "resumed"
        # The overview offers Pause for every queue it lists, one whose work waits for a
        # worker included: pausing such a queue in an incident is what the button is for,
        # so it gets its setting here. A name the overview does not list stays unknown.
        listed = queue in {s.queue for s in await self.client.stats()}
        try:
            if pause:
                changed = await self.client.queues.pause(queue, create=listed)
            else:
                changed = await self.client.queues.resume(queue, create=listed)
        except UnknownQueueError:
            text = (
                f"Not {verb}: queue {queue!r} has no work, no setting and no live worker;"
                " reload the overview for the queues it lists"
            )
            flash = {"text": text, "error": True}
            status = 409
        except CycloneError as exc:
            flash = {"text": f"Not {verb}: {exc}", "error": True}
            status = 409
        else:
            done = "paused: workers claim nothing more from it" if pause else "resumed"
            same = "was paused already" if pause else "was not paused"
            flash = {"text": f"Queue {queue} {done if changed else same}.", "error": False}
            status = 200
        context = await self.pages.overview_context()
        template = "_overview_live.html" if request.headers.get("hx-request") else "overview.html"
        return self.render.page(request, template, status, flash=flash, **context)
