"""``cyclone schedules ls|pause|resume|trigger``: the stored schedules (``client.schedules``)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import asdict

import click

from cyclone._client import Client
from cyclone.cli._common import Listing, command, print_json, subgroup, with_client


@subgroup
def schedules() -> None:
    """List, pause, resume and trigger schedules."""


@command(schedules, "ls")
@click.option("--json", "as_json", is_flag=True)
def schedules_ls(ctx: click.Context, as_json: bool) -> None:
    """List stored schedules: timing, target, state and next slot."""
    rows = with_client(ctx, lambda c: c.schedules.list())
    if as_json:
        print_json([asdict(r) for r in rows])
        return
    listing = Listing("name", "when", "target", "state", "next slot", "last run")
    for r in rows:
        when = f"cron {r.cron!r} {r.tz}" if r.cron is not None else f"every {r.every}"
        state = "paused" if r.paused else "active"
        if not r.declared:
            state += " (undeclared)"  # no running worker declares it: nobody fires it
        origin = "dynamic" if r.dynamic else "declared"
        last = "" if r.last_run_id is None else str(r.last_run_id)
        listing.add(r.name, when, r.target, f"{state}, {origin}", f"{r.next_at:%F %T%z}", last)
    listing.print()


def _change_command(
    verb: str, done: str, help: str, change: Callable[[Client, str], Awaitable[object]]
) -> None:
    """``cyclone schedules VERB NAME``: ``change`` the schedule, then say it is ``done``."""

    @command(schedules, verb)
    @click.argument("name")
    def run(ctx: click.Context, name: str) -> None:
        with_client(ctx, lambda c: change(c, name))
        click.echo(f"{done} {name}")

    run.help = help


_change_command(
    "pause",
    "paused",
    "Stop making runs for NAME until it is resumed (kept across deploys).",
    lambda c, name: c.schedules.pause(name),
)
_change_command(
    "resume",
    "resumed",
    "Make runs for NAME again from its next slot; slots passed while paused are not run.",
    lambda c, name: c.schedules.resume(name),
)


@command(schedules, "trigger")
@click.argument("name")
def schedules_trigger(ctx: click.Context, name: str) -> None:
    """Ask for one run of NAME now; prints the run's key (`cyclone runs ls --key KEY`)."""
    click.echo(with_client(ctx, lambda c: c.schedules.trigger(name)))
