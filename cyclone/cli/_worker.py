"""The commands that set up and run: ``cyclone dev-db`` (a throwaway server), ``cyclone
migrate`` (the schema) and ``cyclone worker`` (a worker for a target until a signal)."""

from __future__ import annotations

import asyncio
import inspect
import logging
import os
import signal
import sys
from collections.abc import Awaitable, Callable
from typing import Any

import click
from click.core import ParameterSource

from cyclone._client import Client
from cyclone._model.steps import Step
from cyclone._model.workflows import Workflow
from cyclone._storage.loader import MIGRATIONS
from cyclone._worker.threads import busy_threads
from cyclone._worker.worker import DEFAULT_CONCURRENCY, Worker
from cyclone.cli._common import Failure, command, main, with_client
from cyclone.cli._supervisor import child_number, supervise
from cyclone.cli._targets import describe, load, parse_queues, read_target, steps_of


@main.command("dev-db")
def dev_db() -> None:
    """Start a throwaway PostgreSQL for local development and print its DSN.

    With CYCLONE_DATABASE_URL set, print that instead and leave its server alone.
    """
    from cyclone.testing import PostgresUnavailableError, postgres_server
    from cyclone.testing import describe as describe_server

    env_var = "CYCLONE_DATABASE_URL"
    try:
        with postgres_server(env_var=env_var) as server:
            # Blocked before the DSN is printed: whoever reads it may signal at once, and the
            # signal must end the wait below rather than this process.
            stops = {signal.SIGINT, signal.SIGTERM}
            signal.pthread_sigmask(signal.SIG_BLOCK, stops)
            click.echo(server.dsn)
            ends = "leaves it running" if server.source == env_var else "deletes its data"
            click.echo(f"# {describe_server(server)}; Ctrl-C stops this and {ends}", err=True)
            signal.sigwait(stops)
    except PostgresUnavailableError as exc:
        raise Failure(str(exc)) from None


@command(main)
@click.option(
    "--check",
    "only_check",
    is_flag=True,
    help="Apply nothing: list the migrations the schema lacks, and exit 1 if it lacks any "
    "(for a deploy pipeline).",
)
def migrate(ctx: click.Context, only_check: bool) -> None:
    """Create or update Cyclone's tables."""
    if only_check:
        _check_pending(ctx)
        return

    async def go(client: Client) -> tuple[list[int], str | None]:
        applied = await client.migrate()
        # A schema migrated by a newer cyclone-pg is not up to date for this one: the check
        # says so (SchemaVersionError) and what to do. Only the migrations are checked: the
        # pool's route (a pooler's settings) is the worker's concern, not the migration's.
        await client.pending_migrations()
        return applied, client.services.database.layout.description

    applied, layout = with_client(ctx, go, check=False)
    on = "" if layout in (None, "PostgreSQL") else f", on {layout}"
    click.echo(
        f"{_applied_text(applied)}; schema {ctx.obj['schema']} is up to date ({_latest()}){on}"
    )


def _check_pending(ctx: click.Context) -> None:
    """``migrate --check``: say what the schema lacks (exit 1) or that it is up to date; a
    schema newer than this package fails as every command does (upgrade cyclone-pg)."""

    async def pending(client: Client) -> list[int]:
        return await client.pending_migrations()

    missing = with_client(ctx, pending, check=False)
    schema = ctx.obj["schema"]
    if not missing:
        click.echo(f"schema {schema} is up to date ({_latest()})")
        return
    names = ", ".join(_migration_name(v) for v in missing)
    lacks = f"{len(missing)} migration{'s' * (len(missing) != 1)}"
    raise Failure(f"schema {schema} lacks {lacks}: {names}; run `cyclone migrate` to apply them")


def _migration_name(version: int) -> str:
    """A migration by its file name, such as ``0008_flow_control``."""
    return f"{version:04d}_{_MIGRATION_NAMES[version]}"


def _applied_text(applied: list[int]) -> str:
    """What one migrate applied, by name: its versions are numbered, not counted (a number
    that no release shipped is no gap to fill)."""
    if not applied:
        return "nothing to apply"
    if len(applied) == 1:
        return f"applied 1 migration, {_migration_name(applied[0])}"
    first, last = _migration_name(applied[0]), _migration_name(applied[-1])
    return f"applied {len(applied)} migrations, {first} to {last}"


def _latest() -> str:
    latest = MIGRATIONS[-1].version
    return f"migration {latest}, {_migration_name(latest)}"


_MIGRATION_NAMES = {m.version: m.name for m in MIGRATIONS}


async def _unless_stopped(stop: asyncio.Event, work: Awaitable[None]) -> bool:
    """Await ``work`` unless ``stop`` is set first (then cancel it); whether it finished."""
    done = asyncio.ensure_future(work)
    stopped = asyncio.ensure_future(stop.wait())
    await asyncio.wait([done, stopped], return_when=asyncio.FIRST_COMPLETED)
    stopped.cancel()
    if not done.done():
        done.cancel()
        await asyncio.gather(done, return_exceptions=True)
        return False
    done.result()
    return True


@command(main)
@click.argument("target")
@click.option("--queues", help="Queues and their concurrency: orders=16,default=4.")
@click.option("--poll-interval", type=float, default=1.0, show_default=True)
@click.option("--shutdown-timeout", type=float, default=30.0, show_default=True)
@click.option(
    "--lease",
    type=float,
    default=30.0,
    show_default=True,
    help="Seconds a claimed task is this worker's without a heartbeat (every lease / 3).",
)
@click.option(
    "--liveness-grace",
    type=float,
    default=1.0,
    show_default=True,
    help="Seconds this worker's liveness lock may stay free (its connection cut) before its "
    "peers release its tasks (docs/operations.md, when a worker dies).",
)
@click.option(
    "--claim-batch", type=int, default=100, show_default=True, help="Most tasks a claim takes."
)
@click.option(
    "--no-claim-ahead",
    "claim_ahead",
    flag_value=False,
    default=True,
    help="Claim only for free slots (docs/worker.md, claiming ahead).",
)
@click.option(
    "--max-connections",
    type=click.IntRange(2),
    help="Pool size (default: the queue limits' sum, one per queue, and 4 more).",
)
@click.option(
    "--wait-for-migrations",
    is_flag=True,
    envvar="CYCLONE_WAIT_FOR_MIGRATIONS",
    help="On an unmigrated schema, wait until `cyclone migrate` has run (default: exit 1).",
)
@click.option(
    "--threads",
    type=click.IntRange(1),
    help="Most plain def handlers running at once, each in a thread (default: one per slot).",
)
@click.option(
    "--processes",
    type=click.IntRange(1),
    default=1,
    show_default=True,
    help="Worker processes under one supervisor, for CPU-bound handlers (child i serves "
    "metrics on --metrics-port + i).",
)
@click.option("--metrics-port", type=click.IntRange(0, 65535), help="Serve /metrics here.")
@click.option("--metrics-host", default="127.0.0.1", show_default=True)
@click.option("--queue-metrics", is_flag=True, help="Also the database-wide gauges (one process).")
def worker(
    ctx: click.Context,
    target: str,
    queues: str | None,
    poll_interval: float,
    shutdown_timeout: float,
    lease: float,
    liveness_grace: float,
    claim_batch: int,
    claim_ahead: bool,
    max_connections: int | None,
    wait_for_migrations: bool,
    threads: int | None,
    processes: int,
    metrics_port: int | None,
    metrics_host: str,
    queue_metrics: bool,
) -> None:
    """Run a worker for TARGET (MODULE:OBJECT) until SIGINT or SIGTERM.

    OBJECT is a step, a workflow, a list of them, or a function (sync or async) that takes
    the client and returns a Worker (configured there: --queues, --poll-interval,
    --shutdown-timeout, --lease, --liveness-grace, --claim-batch and --no-claim-ahead do not
    apply to it).
    MODULE is imported with the current directory first on sys.path. A first signal stops
    gracefully; a second stops at once. --metrics-port serves Prometheus metrics (the
    prometheus extra); --queue-metrics adds the database-wide gauges, to enable in one
    process per database. --processes runs that many worker processes under a supervisor that
    forwards signals and starts again a child that dies (docs/sync-handlers.md).
    """
    if queue_metrics and metrics_port is None:
        raise Failure("--queue-metrics needs --metrics-port")
    found = read_target(target, load(target))  # a bad target fails here, not in each child
    number = child_number()
    if number is None and processes > 1:
        ctx.exit(supervise([sys.executable, "-m", "cyclone", *sys.argv[1:]], processes))
    if number is not None and metrics_port:  # each child its own port; 0 picks one anyway
        metrics_port += number
    queue_metrics = queue_metrics and not number  # the database-wide gauges: once
    limits = parse_queues(queues)
    if callable(found):
        flags = {
            "queues": "--queues",
            "poll_interval": "--poll-interval",
            "shutdown_timeout": "--shutdown-timeout",
            "lease": "--lease",
            "liveness_grace": "--liveness-grace",
            "claim_batch": "--claim-batch",
            "claim_ahead": "--no-claim-ahead",
            "threads": "--threads",
        }
        given = [
            flag
            for name, flag in flags.items()
            if ctx.get_parameter_source(name) is not ParameterSource.DEFAULT
        ]
        if given:
            raise Failure(f"{target} makes its own Worker; {', '.join(given)} would be ignored")
    elif max_connections is None and limits is None:
        limits = {s.queue: DEFAULT_CONCURRENCY for s in steps_of(found)}
    if max_connections is None:
        # A handler holding its completion transaction keeps a connection; the claims,
        # heartbeat, completions and maintenance need theirs beside them.
        max_connections = sum(limits.values()) + len(limits) + 4 if limits else 32

    async def build(client: Client) -> Worker:
        if not callable(found):
            return Worker(
                client,
                steps=[i for i in found if isinstance(i, Step)],
                workflows=[i for i in found if isinstance(i, Workflow)],
                queues=limits,
                poll_interval=poll_interval,
                shutdown_timeout=shutdown_timeout,
                lease=lease,
                liveness_grace=liveness_grace,
                claim_batch=claim_batch,
                claim_ahead=claim_ahead,
                threads=threads,
            )
        made = found(client)
        if inspect.isawaitable(made):
            made = await made
        if not isinstance(made, Worker):
            raise Failure(f"{target} returned {describe(made)}, not a cyclone.Worker")
        return made

    async def go(client: Client) -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        w: Worker | None = None

        def on_signal() -> None:
            if stop.is_set() and w is not None:
                click.echo("cyclone: stopping now", err=True)
                w.hurry()
            stop.set()

        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, on_signal)
        # Until the database answers (and is migrated, with --wait-for-migrations), or a signal.
        ready = client.wait_until_ready(wait_for_schema=wait_for_migrations)
        if not await _unless_stopped(stop, ready):
            return
        w = await build(client)
        stop_metrics = _serve_metrics(client, metrics_port, metrics_host, queue_metrics)
        await w.start()  # refuses a schema that is not this package's
        layout = client.services.database.layout
        on = f" ({layout.description})" if layout.citus else ""
        click.echo(f"cyclone: worker {w.id}{on} running; Ctrl-C stops it", err=True)
        orphaned = loop.create_task(_orphaned(stop)) if number is not None else None
        await stop.wait()
        if orphaned is not None:
            orphaned.cancel()
        click.echo(
            f"cyclone: stopping gracefully: running handlers get up to {w.shutdown_timeout:g} s "
            "to finish, then they are cancelled (again to stop now)",
            err=True,
        )
        await w.stop()
        stop_metrics()

    with_client(ctx, go, connections=max_connections, check=False, lazy=True)
    _exit_past_threads()


async def _orphaned(stop: asyncio.Event) -> None:
    """A supervisor's child: stop when the supervisor is gone (killed, it forwards nothing).
    Its stdin is a pipe the supervisor never writes to: it ends when the supervisor does."""
    reader = asyncio.StreamReader()
    loop = asyncio.get_running_loop()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    await reader.read()
    click.echo("cyclone: the supervisor is gone; stopping gracefully", err=True)
    stop.set()


def _exit_past_threads() -> None:
    """Exit even while handler threads still run: their attempts were handed back at the
    shutdown deadline, and the interpreter would wait for them (they are not daemons)."""
    busy = busy_threads()
    if busy:
        click.echo(
            f"cyclone: {busy} handler thread{'s' * (busy != 1)} still running past the "
            "shutdown deadline (their tasks were handed back); exiting without them",
            err=True,
        )
        logging.shutdown()
        sys.stderr.flush()
        sys.stdout.flush()
        os._exit(0)


def _serve_metrics(
    client: Client, port: int | None, host: str, queue_metrics: bool
) -> Callable[[], Any]:
    """Serve Prometheus metrics on ``host:port`` (none without a port); what stops it."""
    if port is None:
        return lambda: None
    try:
        from cyclone.prometheus import serve_metrics
    except ImportError:
        raise Failure("--metrics-port needs: pip install 'cyclone-pg[prometheus]'") from None
    try:
        server = serve_metrics(client, port, host=host, queue_metrics=queue_metrics)
    except OSError as exc:
        raise Failure(f"cannot serve metrics on {host}:{port}: {exc}") from None
    click.echo(f"cyclone: metrics on http://{host}:{server.server_port}/metrics", err=True)
    return server.shutdown
