"""``cyclone runs ls|show|why|signal|retry|fork|cancel`` and ``cyclone purge``: find, inspect,
explain and steer runs, and delete the old ones."""

from __future__ import annotations

import importlib
import json
import os
import sys
from dataclasses import asdict
from typing import Any

import click
import msgspec
from rich.console import Console
from rich.progress import Progress
from rich.table import Column

from cyclone._client import Client
from cyclone._model.explain import Explanation
from cyclone._model.handles import RunInfo, RunQuery, RunState, items_done, released
from cyclone.cli._common import (
    Failure,
    Listing,
    command,
    console,
    main,
    parse_duration,
    parse_run_id,
    print_json,
    subgroup,
    with_client,
)


def _info_dict(info: RunInfo) -> dict[str, Any]:
    data = asdict(info)
    data["state"] = info.state.value
    return data


@subgroup
def runs() -> None:
    """List, show, explain, signal, retry, fork and cancel runs."""


@command(runs, "ls")
@click.option("--state", type=click.Choice([s.value for s in RunState]), multiple=True)
@click.option("--name")
@click.option("--key")
@click.option("--queue", help="A job's queue, or the queue of any node of a workflow run.")
@click.option("--limit", type=click.IntRange(1, 10_000), default=50, show_default=True)
@click.option("--cursor", help="Where the previous page ended (its next cursor).")
@click.option("--json", "as_json", is_flag=True)
def runs_ls(
    ctx: click.Context,
    state: tuple[str, ...],
    name: str | None,
    key: str | None,
    queue: str | None,
    limit: int,
    cursor: str | None,
    as_json: bool,
) -> None:
    """List runs, newest first, a page at a time: pass the next cursor back as --cursor."""
    query = RunQuery(
        name=name,
        key=key,
        queue=queue,
        limit=limit,
        cursor=cursor,
        state=[RunState(s) for s in state] or None,
    )
    page = with_client(ctx, lambda c: c.list_runs(query))
    if as_json:
        print_json({"runs": [_info_dict(r) for r in page.runs], "next_cursor": page.next_cursor})
        return
    listing = Listing(Column("id", no_wrap=True, min_width=36), "name", "state", "key", "created")
    for r in page.runs:
        listing.add(str(r.id), r.name, r.state.value, r.key or "", f"{r.created_at:%F %T}")
    listing.print()
    if page.next_cursor:
        console.print(f"next page: --cursor {page.next_cursor}", markup=False)


def _levels(info: RunInfo) -> list[list[str]]:
    """The run's nodes by their depth; a map node's items are in its line, not their own."""
    parents: dict[str, list[str]] = {n.name: [] for n in info.nodes if n.map_of is None}
    for parent, child in info.edges:
        parents[child].append(parent)
    depth: dict[str, int] = {}

    def level(name: str) -> int:  # nodes come by name, not in a topological order
        if name not in depth:
            depth[name] = 1 + max((level(p) for p in parents[name]), default=-1)
        return depth[name]

    for name in parents:
        level(name)
    levels: list[list[str]] = [[] for _ in range(max(depth.values(), default=-1) + 1)]
    for name, d in depth.items():
        levels[d].append(name)
    return levels


@command(runs, "show")
@click.argument("run_id")
@click.option("--json", "as_json", is_flag=True)
def runs_show(ctx: click.Context, run_id: str, as_json: bool) -> None:
    """Show a run: its nodes, attempts, errors and graph."""
    rid = parse_run_id(run_id)

    async def go(client: Client) -> RunInfo:
        return await (await client.get_run(rid)).info()

    info = with_client(ctx, go)
    if as_json:
        print_json(_info_dict(info))
        return
    console.print(f"{info.name} {info.id}  {info.state.value}", markup=False)
    if info.key is not None:  # a run without a key has no line for it
        console.print(f"key: {info.key}", markup=False, highlight=False)
    if info.parent_run is not None:
        console.print(f"parent: {info.parent_run} node {info.parent_node}", markup=False)
    if info.forked_from is not None:
        source, node = info.forked_from
        console.print(f"forked from: {source} at node {node}", markup=False, highlight=False)
    for fork, node in info.forks:
        console.print(f"fork: {fork} from node {node}", markup=False, highlight=False)
    for label, value in (("input", info.input), ("output", info.output)):
        text = json.dumps(value, default=str, indent=2)
        console.print(f"{label}: {text}", markup=False, highlight=False)
    if info.error:
        console.print(f"error: {info.error.get('type')}: {info.error.get('message')}", markup=False)
    listing = Listing("node", "kind", "state", "attempts", "last error")
    for n in info.nodes:
        last = n.errors[-1] if n.errors else None
        listing.add(
            n.name,
            n.kind or "(wait)",
            n.state if n.wake_at is None else f"{n.state} until {n.wake_at:%F %T %Z}",
            str(n.attempts),
            f"{last['type']}: {last['message']}" if last else "",
        )
    listing.print()
    for n in info.nodes:
        for error in n.errors:
            if (evidence := released(error)) is not None:
                attempt = f"{n.name} attempt {error.get('attempt', '?')}"
                console.print(f"{attempt} {evidence}", markup=False, highlight=False)
    for n in info.nodes:
        if n.child_run is not None:
            console.print(f"child of {n.name}: {n.child_run}", markup=False, highlight=False)
    states = {n.name: n.state for n in info.nodes}
    for name, (done, total) in items_done(info.nodes).items():  # a map node's line
        states[name] += f", {done}/{total} items"
    for depth, names in enumerate(_levels(info)):
        arrow = "  " * depth + ("└─ " if depth else "")
        console.print(arrow + "  ".join(f"{n} ({states[n]})" for n in names), markup=False)
    for parent, child, value in info.branches:
        taken = f"{parent} -> {child} when {parent} is {json.dumps(value)}"
        console.print(f"branch: {taken}", markup=False, highlight=False)


@command(runs, "why")
@click.argument("run_id")
@click.option("--json", "as_json", is_flag=True)
def runs_why(ctx: click.Context, run_id: str, as_json: bool) -> None:
    """Say why a run is not running: a reason for each node that is not done."""
    rid = parse_run_id(run_id)
    explanation: Explanation = with_client(ctx, lambda c: c.explain(rid))
    if as_json:
        print_json(asdict(explanation))
        return
    console.print(f"{explanation.run_id}  {explanation.state.value}", markup=False)
    for reason in explanation.reasons:
        where = "" if reason.node is None else f"{reason.node} ({reason.code.value}): "
        console.print(where + reason.message, markup=False, highlight=False)
    if explanation.omitted:
        console.print(f"... and {explanation.omitted} more open nodes", markup=False)


@command(runs, "signal")
@click.argument("run_id")
@click.argument("node")
@click.option("--payload", help="JSON for the wait node's output (default: null).")
@click.option("--event", help="The event to deliver, for a node waiting for events.")
def runs_signal(
    ctx: click.Context, run_id: str, node: str, payload: str | None, event: str | None
) -> None:
    """Complete wait node NODE of a run; the payload becomes its output (with --event,
    deliver that event and its payload to a node waiting for events)."""
    rid = parse_run_id(run_id)
    text = "null" if payload is None else payload
    try:
        json.loads(text)
    except json.JSONDecodeError as exc:
        raise Failure(
            f"--payload is not JSON ({exc}); quote it for the shell: --payload '{{\"ok\": true}}'"
        ) from None
    except RecursionError:
        raise Failure("--payload is nested too deeply to decode") from None
    # As JSON text: checked against the node's type, when this process defined it.
    value = msgspec.Raw(text.encode())
    with_client(ctx, lambda c: c.signal(rid, node, value, event=event))
    click.echo(f"signalled {node if event is None else f'{event} of {node}'} of run {rid}")


@command(runs, "retry")
@click.argument("run_id")
@click.option("--node", help="Reset only this failed node.")
def runs_retry(ctx: click.Context, run_id: str, node: str | None) -> None:
    """Re-open a failed run (or one failed node)."""
    rid = parse_run_id(run_id)

    async def go(client: Client) -> None:
        run = await client.get_run(rid)
        await (run.retry(node) if node else run.retry_all())

    with_client(ctx, go)
    click.echo(f"retried {rid}")


@command(runs, "fork")
@click.argument("run_id")
@click.option("--from", "from_node", required=True, help="The node to run again, and after.")
@click.option("--input", "input_json", help="JSON for the fork's input (default: the run's).")
@click.option("--key", help="Fork once per key: a retried command finds the first fork.")
@click.option(
    "--import",
    "modules",
    multiple=True,
    required=True,
    help="A module that defines the run's workflow (a fork runs the current definition).",
)
def runs_fork(
    ctx: click.Context,
    run_id: str,
    from_node: str,
    input_json: str | None,
    key: str | None,
    modules: tuple[str, ...],
) -> None:
    """Fork an ended workflow run: a new run that copies the outputs of the nodes before
    --from and runs --from and every node after it again."""
    rid = parse_run_id(run_id)
    try:
        value = None if input_json is None else json.loads(input_json)
    except (json.JSONDecodeError, RecursionError) as exc:
        raise Failure(f"--input is not JSON ({exc}); quote it for the shell") from None
    if os.getcwd() not in sys.path:  # as `cyclone worker` finds the app's modules
        sys.path.insert(0, os.getcwd())
    for module in modules:
        try:
            importlib.import_module(module)
        except ImportError as exc:
            raise Failure(f"cannot import {module}: {exc}") from None
    fork = with_client(ctx, lambda c: c.fork(rid, from_node=from_node, input=value, key=key))
    made = "forked" if fork.created else f"key {key} had already forked"
    click.echo(f"{made} {rid} from {from_node}: {fork.id}")


@command(runs, "cancel")
@click.argument("run_id")
def runs_cancel(ctx: click.Context, run_id: str) -> None:
    """Cancel a pending, running or failed run."""
    rid = parse_run_id(run_id)

    async def go(client: Client) -> bool:
        return await (await client.get_run(rid)).cancel()

    cancelled = with_client(ctx, go)
    click.echo(f"cancelled {rid}" if cancelled else f"{rid} had already ended")


@command(main)
@click.option("--older-than", "older_than", required=True, help="Age, e.g. 7d, 12h, 30m.")
@click.option(
    "--state",
    type=click.Choice(["completed", "failed", "cancelled", "expired"]),
    multiple=True,
    help="Only these states (default: all four).",
)
def purge(ctx: click.Context, older_than: str, state: tuple[str, ...]) -> None:
    """Delete terminal runs older than --older-than; their keys become free."""
    age = parse_duration(older_than)
    states = [RunState(s) for s in (state or ("completed", "failed", "cancelled", "expired"))]

    async def go(client: Client) -> int:
        with Progress(console=Console(stderr=True), transient=True) as progress:
            task = progress.add_task("purging", total=None)

            seen = 0

            def purged(count: int) -> None:
                nonlocal seen
                seen += count
                progress.update(task, advance=count, description=f"purged {seen}")

            return await client.purge_terminal_runs(age, states=states, on_batch=purged)

    click.echo(f"purged {with_client(ctx, go)} runs")
