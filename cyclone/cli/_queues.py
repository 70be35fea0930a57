"""``cyclone stats`` and ``cyclone queues ls|pause|resume|limit``: live work per queue and
flow control across every worker (docs/flow-control.md)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import asdict
from typing import Any, TypeVar

import click

from cyclone._client import Client
from cyclone._model.errors import UnknownQueueError
from cyclone.cli._common import (
    Failure,
    Listing,
    command,
    main,
    print_json,
    subgroup,
    with_client,
)

T = TypeVar("T")

# The limits of a queue that a kind has not: they apply per group key.
_KEY_LIMITS = ("key_concurrency", "key_rate", "key_per")


def _flow_text(
    paused: bool,
    concurrency: int | None,
    rate: tuple[int, float] | None,
    key_concurrency: int | None,
    key_rate: tuple[int, float] | None = None,
) -> str:
    """``paused, 3 at once, 20/1s, 2 per key, 10/1s per key``; empty for a queue without
    flow control."""
    parts = ["paused"] if paused else []
    if concurrency is not None:
        parts.append(f"{concurrency} at once")
    if rate is not None:
        parts.append(f"{rate[0]}/{rate[1]:g}s")
    if key_concurrency is not None:
        parts.append(f"{key_concurrency} per key")
    if key_rate is not None:
        parts.append(f"{key_rate[0]}/{key_rate[1]:g}s per key")
    return ", ".join(parts)


def _pair(count: int | None, period: float | None) -> tuple[int, float] | None:
    """A rate as (count, period), None unless both are set."""
    return None if count is None or period is None else (count, period)


@command(main)
@click.option("--json", "as_json", is_flag=True)
def stats(ctx: click.Context, as_json: bool) -> None:
    """Live work per queue and the last minute's completions."""
    rows = with_client(ctx, lambda c: c.stats())
    if as_json:
        print_json([asdict(r) for r in rows])
        return
    listing = Listing(
        "queue",
        "available",
        "scheduled",
        "running",
        "expired",
        "blocking",
        "oldest wait",
        "done/min",
        "workers",
        "unserved",
        "flow",
    )
    for r in rows:
        oldest = "" if r.oldest_seconds is None else f"{r.oldest_seconds:.1f}s"
        counts = (r.available, r.scheduled, r.running, r.expired, r.blocking)
        flow = _flow_text(
            r.paused, r.concurrency_limit, r.rate_limit, r.key_concurrency_limit, r.key_rate_limit
        )
        served = (str(r.completed_last_minute), str(r.workers), str(r.unserved))
        listing.add(r.queue, *map(str, counts), oldest, *served, flow)
    listing.print()


def _known(ctx: click.Context, use: Callable[[Client], Awaitable[T]], *, can_create: bool) -> T:
    """``with_client(ctx, use)``, an unknown queue said in the command's own words: the
    library's message names ``create=True``, a keyword this command spells ``--create``."""

    async def go(client: Client) -> T:
        try:
            return await use(client)
        except UnknownQueueError as exc:
            unknown = (
                f"queue {exc.queue!r} is unknown: no setting or live worker uses it; check the name"
            )
            if can_create:
                raise Failure(
                    f"{unknown}, or pass --create to configure it before its first use"
                ) from None
            raise Failure(
                f"{unknown}; a queue without a setting is not paused, so there is nothing to resume"
            ) from None

    return with_client(ctx, go)


@subgroup
def queues() -> None:
    """Pause, resume and limit queues across every worker."""


@command(queues, "ls")
@click.option("--json", "as_json", is_flag=True)
def queues_ls(ctx: click.Context, as_json: bool) -> None:
    """The queues that are paused or limited, and the kinds with limits."""

    async def read(c: Client) -> tuple[list[Any], dict[str, Any]]:
        return await c.queues.list(), await c.queues.kind_limits()

    settings, kinds = with_client(ctx, read)
    if as_json:
        print_json(
            {
                "queues": [asdict(s) for s in settings],
                "kinds": {k: asdict(v) for k, v in kinds.items()},
            }
        )
        return
    listing = Listing("queue or kind", "flow control")
    for s in settings:
        lim = s.limits
        rate, key_rate = _pair(lim.rate, lim.per), _pair(lim.key_rate, lim.key_per)
        text = _flow_text(s.paused, lim.concurrency, rate, lim.key_concurrency, key_rate)
        listing.add(s.queue, text)
    for kind, k in kinds.items():
        listing.add(f"kind {kind}", _flow_text(False, k.concurrency, _pair(k.rate, k.per), None))
    listing.print()


@command(queues, "pause")
@click.argument("queue")
@click.option("--create", is_flag=True, help="Also a queue no worker claims from yet.")
def queues_pause(ctx: click.Context, queue: str, create: bool) -> None:
    """Stop every worker claiming from QUEUE; running work finishes."""
    changed = _known(ctx, lambda c: c.queues.pause(queue, create=create), can_create=True)
    click.echo(f"paused {queue}" if changed else f"{queue} was paused already")


@command(queues, "resume")
@click.argument("queue")
def queues_resume(ctx: click.Context, queue: str) -> None:
    """Let workers claim from QUEUE again (they are woken at once)."""
    changed = _known(ctx, lambda c: c.queues.resume(queue), can_create=False)
    click.echo(f"resumed {queue}" if changed else f"{queue} was not paused")


@command(queues, "limit")
@click.argument("queue")
@click.option("--concurrency", type=int, help="Tasks running at once, all workers.")
@click.option("--rate", type=int, help="Starts per --per.")
@click.option("--per", type=float, help="The rate's period in seconds.")
@click.option("--key-concurrency", type=int, help="Tasks running at once per group key.")
@click.option("--key-rate", type=int, help="Starts per --key-per of each group key.")
@click.option("--key-per", type=float, help="The per-key rate's period in seconds.")
@click.option("--kind", is_flag=True, help="QUEUE names a kind: limit it on every queue.")
@click.option("--create", is_flag=True, help="Also a queue no worker claims from yet.")
def queues_limit(ctx: click.Context, queue: str, kind: bool, create: bool, **limits: Any) -> None:
    """Replace QUEUE's limits (a limit not given is cleared; none given clears them all)."""
    if kind:
        if any(limits[name] is not None for name in _KEY_LIMITS):
            raise click.UsageError(
                "--key-concurrency, --key-rate and --key-per apply to a queue, not to a kind"
            )
        of_kind = {name: v for name, v in limits.items() if name not in _KEY_LIMITS}
        with_client(ctx, lambda c: c.queues.set_kind_limits(queue, **of_kind))
    else:
        _known(ctx, lambda c: c.queues.set_limits(queue, **limits, create=create), can_create=True)
    rate = _pair(limits["rate"], limits["per"])
    key_rate = _pair(limits["key_rate"], limits["key_per"])
    text = _flow_text(False, limits["concurrency"], rate, limits["key_concurrency"], key_rate)
    click.echo(f"{'kind ' if kind else ''}{queue}: {text or 'no limits'}")
