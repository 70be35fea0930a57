"""Server-sent events: one ``change`` event whenever Cyclone's notifications say something
changed (new work on a queue, a run that ended), debounced, so that pages refresh their
tables. The pages also refresh on a timer (shorter while the stream is down): notifications
are hints, and some changes (a node starting) send none.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from starlette.responses import StreamingResponse

from cyclone._client import Client

DEBOUNCE = 0.3
"""Seconds to gather a burst of notifications into one refresh."""
KEEPALIVE = 15.0
"""Seconds between comments that keep proxies from closing an idle stream."""
LIFETIME = 300.0
"""Seconds a stream lasts; the browser reconnects (so a server can shut down cleanly)."""


async def changes(client: Client, *, lifetime: float = LIFETIME) -> AsyncIterator[str]:
    """The event stream's text: a retry hint, then change events and keep-alives."""
    loop = asyncio.get_running_loop()
    yield "retry: 2000\n\n"
    async with client.watch() as changed:
        end = loop.time() + lifetime
        while (left := end - loop.time()) > 0:
            try:
                await asyncio.wait_for(changed.wait(), min(KEEPALIVE, left))
            except TimeoutError:
                yield ": keep-alive\n\n"
                continue
            await asyncio.sleep(DEBOUNCE)
            changed.clear()
            yield "event: change\ndata: {}\n\n"


def events(client: Client) -> StreamingResponse:
    """The ``/events`` response."""
    return StreamingResponse(
        changes(client),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
    )
