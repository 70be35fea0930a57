"""Steps and workflows the dashboard's tests run: a pipeline whose middle node fails while
``FAILING`` is set (with a hostile error message), a wait, a step that runs until cancelled,
a map node and a skipped branch, a child workflow, a step that streams and reports progress."""

from __future__ import annotations

import asyncio
from typing import Any

import cyclone

HOSTILE = '<script>document.title="pwned"</script><b>bold</b>'
"""Text that would run or render as markup if the dashboard did not escape it."""
FAILING = {"charge": True}
PROGRESS_GATE: dict[str, asyncio.Event] = {}
"""The event ``web.progress`` waits for, made on the worker's loop by the test."""


@cyclone.step("web.fetch", queue="web")
async def fetch(ctx: cyclone.Context, order: dict[str, Any]) -> dict[str, Any]:
    return {"fetched": order.get("id")}


@cyclone.step("web.charge", queue="payments", max_attempts=1)
async def charge(ctx: cyclone.Context, order: dict[str, Any]) -> str:
    if FAILING["charge"]:
        raise ValueError(f"card declined {HOSTILE}")
    return "charged"


@cyclone.step("web.ship", queue="web")
async def ship(ctx: cyclone.Context, order: dict[str, Any]) -> str:
    return "shipped"


@cyclone.step("web.echo", queue="web")
async def echo(ctx: cyclone.Context, value: Any) -> Any:
    return value


@cyclone.step("web.forever", queue="slow")
async def forever(ctx: cyclone.Context, value: Any) -> None:
    await asyncio.Event().wait()  # until the run is cancelled


@cyclone.step("web.progress", queue="web")
async def progressing(ctx: cyclone.Context, lines: int) -> int:
    for i in range(lines):
        await ctx.stream({"line": i})
    await ctx.report({"done": 1, "total": 2})
    await PROGRESS_GATE["gate"].wait()
    await ctx.report(1.0)
    return lines


pipeline = cyclone.define_result("web.pipeline", dict[str, Any], str)
n_fetch = pipeline.node(fetch)
n_charge = pipeline.node(charge, after=[n_fetch])
n_ship = pipeline.node(ship, after=[n_charge])
pipeline.set_result(n_ship)

approval = cyclone.define("web.approval", dict[str, Any])
n_wait = approval.wait("approve")
approval.node(ship, name="after", after=[n_wait])

# A map node over the input, and a branch not taken on "yes".
shaped = cyclone.define("web.shaped", list[Any])
n_gate = shaped.node(echo, name="gate")
shaped.map(echo, name="each", max_parallel=2)
shaped.node(echo, name="never", after=[n_gate.when(["no"])])

# A child node, and the workflow it submits a run of.
kid = cyclone.define("web.kid", Any)
kid.node(echo, name="x")
parented = cyclone.define("web.parented", Any)
parented.child(kid, name="k")

STEPS = [fetch, charge, ship, echo, forever, progressing]
WORKFLOWS = [pipeline, approval, shaped, parented]
