"""A run's progress and stream as server-sent events, for the run page's progress bars and
its stream's last items.

Events: ``progress`` (the latest progress of each node, by node, whenever it changed),
``item`` (one stream item; its SSE id is its offset, so a browser that reconnects resumes
after the last item it got, through ``Last-Event-ID``), and ``end`` once the run has ended
and everything it streamed was sent. A new connection starts ``TAIL`` items before the
stream's end, unless it asks for ``?after=`` an offset.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import msgspec
from starlette.requests import Request
from starlette.responses import StreamingResponse

from cyclone._client import Client
from cyclone._services.streams import READ_BATCH, Streams
from cyclone.web import _filters
from cyclone.web._filters import BadRequest

TAIL = 20
"""Items before the stream's end that a new connection starts with."""
KEEPALIVE = 15.0
"""Seconds between comments that keep proxies from closing an idle stream."""
LIFETIME = 300.0
"""Seconds a stream lasts; the browser reconnects and resumes from its last item."""


def _event(name: str, data: object, event_id: int | None = None) -> str:
    head = f"event: {name}\n" + ("" if event_id is None else f"id: {event_id}\n")
    return head + "data: " + msgspec.json.encode(data).decode() + "\n\n"


async def run_events(
    streams: Streams, run_id: uuid.UUID, after: int, *, lifetime: float = LIFETIME
) -> AsyncIterator[str]:
    """The event stream's text: a retry hint, then progress, items and the end."""
    loop = asyncio.get_running_loop()
    yield "retry: 2000\n\n"
    end = loop.time() + lifetime
    quiet_since = loop.time()
    progress: dict[str, object] | None = None
    async with streams.watching(run_id) as wake:
        while loop.time() < end:
            wake.arm()
            page = await streams.read(run_id, after, None)
            for item in page.items:
                after = item.offset
                data = {
                    "offset": item.offset,
                    "node": item.node,
                    "attempt": item.attempt,
                    "value": item.value,
                }
                yield _event("item", data, item.offset)
            sent = bool(page.items)
            # Read after the items: progress written before the run's end is seen here.
            latest = await streams.progress(run_id)
            if latest != progress:
                progress, sent = latest, True
                yield _event("progress", latest)
            if sent:
                quiet_since = loop.time()
            if len(page.items) == READ_BATCH:
                continue
            if page.ended:
                yield _event("end", {})
                return
            await wake.wait(bool(page.items))
            if loop.time() - quiet_since >= KEEPALIVE:
                quiet_since = loop.time()
                yield ": keep-alive\n\n"


async def events(client: Client, request: Request) -> StreamingResponse:
    """The ``/runs/{run_id}/stream`` response: :class:`RunNotFoundError` before it starts
    when the run is not visible, :class:`BadRequest` for an offset that is not one."""
    run_id = _filters.path_run_id(request)
    streams = client.services.streams
    text = request.headers.get("last-event-id") or request.query_params.get("after")
    head = (await streams.read(run_id, 0, None, limit=0)).head
    if text is None:
        after = max(head - TAIL, 0)
    else:
        try:
            after = int(text)
        except ValueError:
            raise BadRequest(f"after must be a stream offset (an int), got {text!r}") from None
        if after < 0:
            raise BadRequest(f"after must be 0 or more, got {after}")
    return StreamingResponse(
        run_events(streams, run_id, after),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
    )
