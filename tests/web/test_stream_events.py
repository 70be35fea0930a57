"""The run page's server-sent events (``/runs/{id}/stream``): progress, items with their
offsets as event ids, the end; a new connection starts at the stream's last items, a
reconnect resumes after ``Last-Event-ID``; live events while the handler runs."""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import Any

import cyclone
from cyclone.testing.plugin import CycloneEnv
from cyclone.web import _stream
from tests.web.conftest import Make

gate: dict[str, asyncio.Event] = {}


@cyclone.step("web.lines", queue="web-streams")
async def lines(ctx: cyclone.Context, n: int) -> int:
    for i in range(n):
        await ctx.stream(i)
    await ctx.report(0.5)
    if "open" in gate:
        await gate["open"].wait()
    return n


def parse(text: str) -> list[tuple[str, int | None, Any]]:
    """(event, id, data) of each event of an SSE body; comments and the retry hint left out."""
    events = []
    for block in text.split("\n\n"):
        fields = dict(
            line.split(": ", 1) for line in block.splitlines() if not line.startswith(":")
        )
        if "event" in fields:
            ident = int(fields["id"]) if "id" in fields else None
            events.append((fields["event"], ident, json.loads(fields["data"])))
    return events


async def test_a_runs_events_tail_resume_and_end(cyclone_env: CycloneEnv, make_dash: Make) -> None:
    run = await lines.enqueue(cyclone_env.client, 30)
    await cyclone_env.drain(steps=[lines])
    async with make_dash() as dash:
        page = await dash.get(f"/runs/{run.id}/stream")
        assert page.headers["content-type"].startswith("text/event-stream")
        events = parse(page.text)
        # A new connection: the last TAIL items, the progress, then the end.
        items = [(i, d) for e, i, d in events if e == "item"]
        assert [i for i, _ in items] == list(range(11, 31))
        assert items[0][1] == {"offset": 11, "node": "web.lines", "attempt": 1, "value": 10}
        assert ("progress", None, {"web.lines": 0.5}) in events
        assert events[-1] == ("end", None, {})
        # A browser reconnecting resumes after the last event id it got.
        again = parse(
            (await dash.get(f"/runs/{run.id}/stream", headers={"Last-Event-ID": "28"})).text
        )
        assert [i for e, i, _ in again if e == "item"] == [29, 30]
        everything = parse((await dash.get(f"/runs/{run.id}/stream?after=0")).text)
        assert len([e for e, _, _ in everything if e == "item"]) == 30
        bad = await dash.get(f"/runs/{run.id}/stream?after=x")
        assert bad.status_code == 400 and "stream offset" in bad.text
        gone = await dash.get(f"/runs/{uuid.uuid4()}/stream")
        assert gone.status_code == 404


async def test_events_come_while_the_handler_runs(cyclone_env: CycloneEnv) -> None:
    gate["open"] = asyncio.Event()
    try:
        run = await lines.enqueue(cyclone_env.client, 2)
        events = _stream.run_events(cyclone_env.client.services.streams, run.id, 0)
        async with cyclone_env.worker(steps=[lines]):
            async with asyncio.timeout(60):
                assert await anext(events) == "retry: 2000\n\n"
                seen: list[tuple[str, int | None, Any]] = []
                while ("progress", None, {"web.lines": 0.5}) not in seen:
                    seen += parse(await anext(events))
                assert [d["value"] for e, _, d in seen if e == "item"] == [0, 1]
                assert await run.status() is cyclone.RunState.RUNNING
                gate["open"].set()
                rest = [parse(text) async for text in events]
        assert rest[-1] == [("end", None, {})]
    finally:
        del gate["open"]
