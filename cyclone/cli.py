"""The ``cyclone`` command: migrate, run a worker, inspect and steer runs, purge, stats.

Every command takes the connection options (``--dsn`` or ``CYCLONE_DATABASE_URL``,
``--schema``, ``--statement-cache-size``, ``--no-notify``, ``--listen-dsn``) before or after
its name. Listings take ``--json`` for scripts. Bad input, an unreachable or unmigrated
database prints one line on stderr and exits with status 1 (2 for usage errors), never a
traceback; ``cyclone worker`` waits for an unreachable database instead.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import importlib
import inspect
import json
import logging
import os
import re
import signal
import sys
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import asdict
from typing import Any, TypeVar

try:
    import click
    from click.core import ParameterSource
    from rich.console import Console
    from rich.progress import Progress
    from rich.table import Column, Table
    from rich.text import Text
except ImportError as exc:  # pragma: no cover - depends on the install
    raise SystemExit("the cyclone command needs its extra: pip install 'cyclone-pg[cli]'") from exc

import asyncpg

from cyclone import _queries as db
from cyclone._client import Client
from cyclone._errors import CycloneError
from cyclone._kinds import Step
from cyclone._queries import DATABASE_ERRORS
from cyclone._run import RunInfo, RunQuery, RunState
from cyclone._sql import validate_identifier
from cyclone._worker import DEFAULT_CONCURRENCY, Worker
from cyclone._workflow import Workflow

T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])
# Piped output is not cut to 80 columns: that width is for a terminal (or $COLUMNS).
console = Console(width=None if sys.stdout.isatty() or "COLUMNS" in os.environ else 10_000)
_DURATION = re.compile(r"^(\d+(?:\.\d+)?)([smhdw])$")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


class Failure(click.ClickException):
    """A one-line error and exit status 1."""

    def show(self, file: Any = None) -> None:
        click.echo(f"cyclone: {self.message}", err=True)


def _run(coro: Awaitable[T]) -> T:
    try:
        return asyncio.run(coro)  # type: ignore[arg-type]
    except CycloneError as exc:
        raise Failure(str(exc)) from None
    except (TimeoutError, *DATABASE_ERRORS) as exc:
        raise Failure(f"database error: {exc}") from None


def parse_duration(text: str) -> dt.timedelta:
    """``90s``, ``15m``, ``12h``, ``7d``, ``2w`` as a timedelta."""
    match = _DURATION.fullmatch(text.strip())
    if not match:
        raise Failure(f"{text!r} is not a duration like 90s, 15m, 12h, 7d or 2w")
    return dt.timedelta(seconds=float(match[1]) * _UNITS[match[2]])


async def _with_client(
    ctx: click.Context,
    use: Callable[[Client], Awaitable[T]],
    *,
    connections: int = 4,
    check: bool = True,
    lazy: bool = False,
) -> T:
    """Run ``use`` with a client on a pool of its own; ``check``: refuse an unmigrated schema;
    ``lazy``: connect on first use (a worker may start before the database does)."""
    opts = ctx.obj
    dsn, schema = opts.get("dsn"), opts["schema"]
    if not dsn:
        raise Failure("no database: pass --dsn or set CYCLONE_DATABASE_URL")
    try:
        validate_identifier(schema, what="--schema")
    except ValueError as exc:
        raise Failure(str(exc)) from None
    pool_options: dict[str, Any] = {}
    if opts.get("statement_cache_size") is not None:
        pool_options["statement_cache_size"] = opts["statement_cache_size"]
    try:
        pool = await asyncio.wait_for(
            asyncpg.create_pool(
                dsn, min_size=0 if lazy else 1, max_size=connections, **pool_options
            ),
            15,
        )
    except (TimeoutError, *DATABASE_ERRORS, ValueError) as exc:
        raise Failure(f"cannot connect to the database: {exc}") from None
    try:
        client = Client(
            pool, schema=schema, notify=opts["notify"], listen_dsn=opts.get("listen_dsn")
        )
        async with client:
            if check:
                await client.check_schema()
            return await use(client)
    finally:
        await pool.close()


def _run_id(text: str) -> uuid.UUID:
    try:
        return uuid.UUID(text)
    except ValueError:
        raise Failure(f"{text!r} is not a run id") from None


def _add_row(table: Table, *cells: str) -> None:
    # Run data is not rich markup: "[x]" in an error message must print as it is.
    table.add_row(*(Text(cell) for cell in cells))


def _json(value: Any) -> None:
    click.echo(json.dumps(value, default=str, indent=2))


def _info_dict(info: RunInfo) -> dict[str, Any]:
    data = asdict(info)
    data["state"] = info.state.value
    return data


def _store(ctx: click.Context, param: click.Parameter, value: Any) -> None:
    # The group stores every value (its defaults too); a subcommand only what it was given.
    obj = ctx.ensure_object(dict)
    if value is not None or param.name not in obj:
        obj[str(param.name)] = value


_CONNECTION_OPTIONS: list[tuple[tuple[str, ...], dict[str, Any]]] = [
    (("--dsn",), {"envvar": "CYCLONE_DATABASE_URL", "help": "PostgreSQL DSN."}),
    (
        ("--schema",),
        {
            "envvar": "CYCLONE_SCHEMA",
            "default": "public",
            "show_default": True,
            "help": "Cyclone's schema.",
        },
    ),
    (
        ("--statement-cache-size",),
        {
            "envvar": "CYCLONE_STATEMENT_CACHE_SIZE",
            "type": click.IntRange(0),
            "help": "asyncpg's prepared statements per connection (default 100); "
            "0 behind PgBouncer in transaction mode.",
        },
    ),
    (
        ("--notify/--no-notify",),
        {
            "envvar": "CYCLONE_NOTIFY",
            "default": True,
            "show_default": True,
            "help": "LISTEN for wakeups; --no-notify (poll only) behind PgBouncer in "
            "transaction mode.",
        },
    ),
    (
        ("--listen-dsn",),
        {
            "envvar": "CYCLONE_LISTEN_DSN",
            "help": "Where the LISTEN connection goes (default: --dsn); straight to "
            "PostgreSQL when --dsn is PgBouncer in transaction mode.",
        },
    ),
]


def _connection_options(*, top: bool) -> Callable[[F], F]:
    """Add the connection options; on a subcommand they override the group's."""

    def decorate(command: F) -> F:
        for decls, attrs in reversed(_CONNECTION_OPTIONS):
            if not top:  # the environment and the defaults are read once, by the group
                attrs = {**attrs, "envvar": None, "default": None, "show_default": False}
            else:
                attrs = {**attrs, "show_envvar": True}
            command = click.option(*decls, expose_value=False, callback=_store, **attrs)(command)
        return command

    return decorate


@click.group()
@_connection_options(top=True)
@click.option("-v", "--verbose", is_flag=True, help="Log at INFO level.")
def main(verbose: bool) -> None:
    """Cyclone: durable jobs and workflows in PostgreSQL."""
    logging.basicConfig(
        level=logging.INFO if verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )


@main.command()
@_connection_options(top=False)
@click.pass_context
def migrate(ctx: click.Context) -> None:
    """Create or update Cyclone's tables."""

    async def go(client: Client) -> tuple[list[int], list[int]]:
        applied = await client.migrate()
        async with client._acquire() as conn:
            return applied, await db.migrations_applied(conn, client.queries)

    applied, present = _run(_with_client(ctx, go, check=False))
    click.echo(f"applied: {applied or 'none'}; schema {ctx.obj['schema']} is at {present}")


def _load(target: str) -> Any:
    module_name, _, attr = target.partition(":")
    if not module_name or not attr:
        raise Failure(f"{target!r} is not MODULE:OBJECT")
    # The console script's sys.path starts with its own folder: put the current one first,
    # as `python -m`, uvicorn and celery do, so `cyclone worker myjobs:WORK` finds myjobs.
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise Failure(f"cannot import {module_name}: {exc}") from None
    obj: Any = module
    try:
        for part in attr.split("."):  # MODULE:OBJECT.ATTRIBUTE, as uvicorn takes it
            obj = getattr(obj, part)
    except AttributeError:
        raise Failure(f"{module_name} has no {attr!r}") from None
    return obj


def _queues(text: str | None) -> dict[str, int] | None:
    if not text:
        return None
    queues = {}
    for part in text.split(","):
        name, _, limit = part.partition("=")
        if not name or not limit.isdigit() or int(limit) < 1:
            raise Failure(f"--queues: {part!r} is not QUEUE=LIMIT")
        queues[name.strip()] = int(limit)
    return queues


_ACCEPTED = (
    "a step, a workflow, a list of them, or a function that takes the client and returns "
    "a cyclone.Worker"
)


def _describe(obj: Any) -> str:
    """What ``obj`` is, in a few words, for an error message."""
    if inspect.isfunction(obj) or inspect.isclass(obj) or inspect.ismethod(obj):
        try:
            sig = inspect.signature(obj)
        except (TypeError, ValueError):  # some builtins have none
            signature = "(...)"
        else:  # the parameters, without their annotations
            bare = [p.replace(annotation=p.empty) for p in sig.parameters.values()]
            signature = str(sig.replace(parameters=bare, return_annotation=sig.empty))
        return f"{type(obj).__name__} {obj.__qualname__}{signature}"
    text = repr(obj)
    return f"{type(obj).__name__} {text if len(text) <= 60 else text[:57] + '...'}"


def _takes_client(obj: Any) -> bool:
    try:
        inspect.signature(obj).bind(None)
    except TypeError:
        return False
    except ValueError:  # no signature to read: let the call tell
        return True
    return True


def _target(target: str, obj: Any) -> list[Any] | Callable[[Client], Any]:
    """The steps and workflows ``obj`` names, or the factory it is; else one clear Failure."""
    if isinstance(obj, Step | Workflow):
        return [obj]
    if isinstance(obj, list | tuple | set | frozenset):
        others = [i for i in obj if not isinstance(i, Step | Workflow)]
        if obj and not others:
            return list(obj)
        kind = type(obj).__name__
        found = f"a {kind} holding {_describe(others[0])}" if others else f"an empty {kind}"
    elif isinstance(obj, Worker):
        found = "a Worker built at import time, which cannot use this command's pool"
    elif callable(obj) and _takes_client(obj):
        factory: Callable[[Client], Any] = obj
        return factory
    elif callable(obj):
        found = f"{_describe(obj)}, which cannot be called with the client"
    else:
        found = _describe(obj)
    raise Failure(f"{target} is {found}; give {_ACCEPTED}")


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


@main.command()
@click.argument("target")
@click.option("--queues", help="Queues and their concurrency: orders=16,default=4.")
@click.option("--poll-interval", type=float, default=1.0, show_default=True)
@click.option("--shutdown-timeout", type=float, default=30.0, show_default=True)
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
@click.option("--metrics-port", type=click.IntRange(0, 65535), help="Serve /metrics here.")
@click.option("--metrics-host", default="127.0.0.1", show_default=True)
@click.option("--queue-metrics", is_flag=True, help="Also the database-wide gauges (one process).")
@_connection_options(top=False)
@click.pass_context
def worker(
    ctx: click.Context,
    target: str,
    queues: str | None,
    poll_interval: float,
    shutdown_timeout: float,
    max_connections: int | None,
    wait_for_migrations: bool,
    metrics_port: int | None,
    metrics_host: str,
    queue_metrics: bool,
) -> None:
    """Run a worker for TARGET (MODULE:OBJECT) until SIGINT or SIGTERM.

    OBJECT is a step, a workflow, a list of them, or a function (sync or async) that takes
    the client and returns a Worker (configured there: --queues, --poll-interval and
    --shutdown-timeout do not apply to it). MODULE is imported with the current directory
    first on sys.path. A first signal stops gracefully; a second stops at once.
    --metrics-port serves Prometheus metrics (the prometheus extra); --queue-metrics adds the
    database-wide gauges, to enable in one process per database.
    """
    if queue_metrics and metrics_port is None:
        raise Failure("--queue-metrics needs --metrics-port")
    found = _target(target, _load(target))
    limits = _queues(queues)
    if callable(found):
        given = [
            f"--{name.replace('_', '-')}"
            for name in ("queues", "poll_interval", "shutdown_timeout")
            if ctx.get_parameter_source(name) is not ParameterSource.DEFAULT
        ]
        if given:
            raise Failure(f"{target} makes its own Worker; {', '.join(given)} would be ignored")
    elif max_connections is None and limits is None:
        limits = {s.queue: DEFAULT_CONCURRENCY for s in _steps_of(found)}
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
            )
        made = found(client)
        if inspect.isawaitable(made):
            made = await made
        if not isinstance(made, Worker):
            raise Failure(f"{target} returned {_describe(made)}, not a cyclone.Worker")
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
        ready = client._wait_until_ready(wait_for_schema=wait_for_migrations)
        if not await _unless_stopped(stop, ready):
            return
        w = await build(client)
        server = None
        if metrics_port is not None:
            try:
                from cyclone.prometheus import serve_metrics
            except ImportError:
                raise Failure(
                    "--metrics-port needs: pip install 'cyclone-pg[prometheus]'"
                ) from None
            try:
                server = serve_metrics(
                    client, metrics_port, host=metrics_host, queue_metrics=queue_metrics
                )
            except OSError as exc:
                raise Failure(
                    f"cannot serve metrics on {metrics_host}:{metrics_port}: {exc}"
                ) from None
            url = f"http://{metrics_host}:{server.server_port}/metrics"
            click.echo(f"cyclone: metrics on {url}", err=True)
        await w.start()  # refuses a schema that is not this package's
        click.echo(f"cyclone: worker {w.id} running; Ctrl-C stops it", err=True)
        await stop.wait()
        click.echo("cyclone: stopping gracefully (again to stop now)", err=True)
        await w.stop()
        if server is not None:
            server.shutdown()

    _run(_with_client(ctx, go, connections=max_connections, check=False, lazy=True))


def _steps_of(items: list[Any]) -> list[Step[Any, Any]]:
    """The steps among ``items`` and in its workflows."""
    steps = [i for i in items if isinstance(i, Step)]
    for wf in items:
        if isinstance(wf, Workflow):
            steps.extend(wf.steps())
    return steps


@main.group()
@_connection_options(top=False)
def runs() -> None:
    """List, show, signal, retry and cancel runs."""


@runs.command("ls")
@click.option("--state", type=click.Choice([s.value for s in RunState]), multiple=True)
@click.option("--name")
@click.option("--key")
@click.option("--limit", type=click.IntRange(1, 10_000), default=50, show_default=True)
@click.option("--cursor", help="Where the previous page ended (its next cursor).")
@click.option("--json", "as_json", is_flag=True)
@_connection_options(top=False)
@click.pass_context
def runs_ls(
    ctx: click.Context,
    state: tuple[str, ...],
    name: str | None,
    key: str | None,
    limit: int,
    cursor: str | None,
    as_json: bool,
) -> None:
    """List runs, newest first, a page at a time: pass the next cursor back as --cursor."""
    query = RunQuery(
        name=name,
        key=key,
        limit=limit,
        cursor=cursor,
        state=[RunState(s) for s in state] or None,
    )
    page = _run(_with_client(ctx, lambda c: c.list_runs(query)))
    if as_json:
        _json({"runs": [_info_dict(r) for r in page.runs], "next_cursor": page.next_cursor})
        return
    table = Table(Column("id", no_wrap=True, min_width=36), "name", "state", "key", "created")
    for r in page.runs:
        _add_row(table, str(r.id), r.name, r.state.value, r.key or "", f"{r.created_at:%F %T}")
    console.print(table)
    if page.next_cursor:
        console.print(f"next page: --cursor {page.next_cursor}", markup=False)


def _levels(info: RunInfo) -> list[list[str]]:
    parents: dict[str, list[str]] = {n.name: [] for n in info.nodes}
    for parent, child in info.edges:
        parents[child].append(parent)
    depth: dict[str, int] = {}

    def level(name: str) -> int:  # nodes come by name, not in a topological order
        if name not in depth:
            depth[name] = 1 + max((level(p) for p in parents[name]), default=-1)
        return depth[name]

    for node in info.nodes:
        level(node.name)
    levels: list[list[str]] = [[] for _ in range(max(depth.values(), default=-1) + 1)]
    for name, d in depth.items():
        levels[d].append(name)
    return levels


@runs.command("show")
@click.argument("run_id")
@click.option("--json", "as_json", is_flag=True)
@_connection_options(top=False)
@click.pass_context
def runs_show(ctx: click.Context, run_id: str, as_json: bool) -> None:
    """Show a run: its nodes, attempts, errors and graph."""
    rid = _run_id(run_id)

    async def go(client: Client) -> RunInfo:
        return await (await client.get_run(rid)).info()

    info = _run(_with_client(ctx, go))
    if as_json:
        _json(_info_dict(info))
        return
    console.print(f"{info.name} {info.id}  {info.state.value}  key={info.key}", markup=False)
    for label, value in (("input", info.input), ("output", info.output)):
        text = json.dumps(value, default=str, indent=2)
        console.print(f"{label}: {text}", markup=False, highlight=False)
    if info.error:
        console.print(f"error: {info.error.get('type')}: {info.error.get('message')}", markup=False)
    table = Table("node", "kind", "state", "attempts", "last error")
    for n in info.nodes:
        last = n.errors[-1] if n.errors else None
        _add_row(
            table,
            n.name,
            n.kind or "(wait)",
            n.state,
            str(n.attempts),
            f"{last['type']}: {last['message']}" if last else "",
        )
    console.print(table)
    states = {n.name: n.state for n in info.nodes}
    for depth, names in enumerate(_levels(info)):
        arrow = "  " * depth + ("└─ " if depth else "")
        console.print(arrow + "  ".join(f"{n} ({states[n]})" for n in names), markup=False)


@runs.command("signal")
@click.argument("run_id")
@click.argument("node")
@click.option("--payload", help="JSON for the wait node's output (default: null).")
@_connection_options(top=False)
@click.pass_context
def runs_signal(ctx: click.Context, run_id: str, node: str, payload: str | None) -> None:
    """Complete wait node NODE of a run; the payload becomes its output."""
    rid = _run_id(run_id)
    try:
        value = None if payload is None else json.loads(payload)
    except json.JSONDecodeError as exc:
        raise Failure(
            f"--payload is not JSON ({exc}); quote it for the shell: --payload '{{\"ok\": true}}'"
        ) from None
    except RecursionError:
        raise Failure("--payload is nested too deeply to decode") from None
    _run(_with_client(ctx, lambda c: c.signal(rid, node, value)))
    click.echo(f"signalled {node} of run {rid}")


@runs.command("retry")
@click.argument("run_id")
@click.option("--node", help="Reset only this failed node.")
@_connection_options(top=False)
@click.pass_context
def runs_retry(ctx: click.Context, run_id: str, node: str | None) -> None:
    """Re-open a failed run (or one failed node)."""
    rid = _run_id(run_id)

    async def go(client: Client) -> None:
        run = await client.get_run(rid)
        await (run.retry(node) if node else run.retry_all())

    _run(_with_client(ctx, go))
    click.echo(f"retried {rid}")


@runs.command("cancel")
@click.argument("run_id")
@_connection_options(top=False)
@click.pass_context
def runs_cancel(ctx: click.Context, run_id: str) -> None:
    """Cancel a pending, running or failed run."""
    rid = _run_id(run_id)

    async def go(client: Client) -> bool:
        return await (await client.get_run(rid)).cancel()

    cancelled = _run(_with_client(ctx, go))
    click.echo(f"cancelled {rid}" if cancelled else f"{rid} had already ended")


@main.command()
@click.option("--older-than", "older_than", required=True, help="Age, e.g. 7d, 12h, 30m.")
@click.option(
    "--state",
    type=click.Choice(["completed", "failed", "cancelled"]),
    multiple=True,
    help="Only these states (default: all three).",
)
@_connection_options(top=False)
@click.pass_context
def purge(ctx: click.Context, older_than: str, state: tuple[str, ...]) -> None:
    """Delete terminal runs older than --older-than; their keys become free."""
    age = parse_duration(older_than)
    states = [RunState(s) for s in (state or ("completed", "failed", "cancelled"))]

    async def go(client: Client) -> int:
        total = 0
        with Progress(console=Console(stderr=True), transient=True) as progress:
            task = progress.add_task("purging", total=None)

            def purged(count: int) -> None:
                nonlocal total
                total += count
                progress.update(task, advance=count, description=f"purged {total}")

            await client._purge([(s, age) for s in states], 1000, batches=None, on_batch=purged)
        return total

    click.echo(f"purged {_run(_with_client(ctx, go))} runs")


@main.command()
@click.option("--json", "as_json", is_flag=True)
@_connection_options(top=False)
@click.pass_context
def stats(ctx: click.Context, as_json: bool) -> None:
    """Live work per queue and the last minute's completions."""
    rows = _run(_with_client(ctx, lambda c: c.stats()))
    if as_json:
        _json([asdict(r) for r in rows])
        return
    table = Table(
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
        _add_row(
            table,
            r.queue,
            str(r.available),
            str(r.scheduled),
            str(r.running),
            str(r.expired),
            str(r.blocking),
            oldest,
            str(r.completed_last_minute),
            str(r.workers),
            str(r.unserved),
            _flow_text(
                r.paused,
                r.concurrency_limit,
                r.rate_limit,
                r.key_concurrency_limit,
                r.key_rate_limit,
            ),
        )
    console.print(table)


@main.command("dev-db")
def dev_db() -> None:
    """Start a throwaway PostgreSQL for local development and print its DSN.

    With CYCLONE_DATABASE_URL set, print that instead and leave its server alone.
    """
    from cyclone.testing import PostgresUnavailableError, describe, postgres_server

    env_var = "CYCLONE_DATABASE_URL"
    try:
        with postgres_server(env_var=env_var) as server:
            # Blocked before the DSN is printed: whoever reads it may signal at once, and the
            # signal must end the wait below rather than this process.
            stops = {signal.SIGINT, signal.SIGTERM}
            signal.pthread_sigmask(signal.SIG_BLOCK, stops)
            click.echo(server.dsn)
            ends = "leaves it running" if server.source == env_var else "deletes its data"
            click.echo(f"# {describe(server)}; Ctrl-C stops this and {ends}", err=True)
            signal.sigwait(stops)
    except PostgresUnavailableError as exc:
        raise Failure(str(exc)) from None


@main.command()
@click.option("--bind", default="127.0.0.1:8080", show_default=True, help="HOST:PORT to listen on.")
@click.option("--read-only", is_flag=True, help="No actions, even on a loopback address.")
@click.option("--title", default="Cyclone", show_default=True, help="The pages' title.")
@click.pass_context
def dashboard(ctx: click.Context, bind: str, read_only: bool, title: str) -> None:
    """Serve the web dashboard (needs cyclone-pg[web]) until SIGINT or SIGTERM.

    Actions (retry, cancel, signal) are served only on a loopback address: elsewhere the
    dashboard is read-only, as this command has no authentication. To act from other
    machines, mount cyclone.web.dashboard in your own app behind its auth.
    """
    import socket

    try:
        import uvicorn

        from cyclone.web import dashboard as make_dashboard
        from cyclone.web._security import is_loopback
    except ImportError:
        raise Failure("the dashboard needs its extra: pip install 'cyclone-pg[web]'") from None
    host, sep, port_text = bind.rpartition(":")
    if not sep or not host or not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise Failure(f"--bind {bind!r} is not HOST:PORT, e.g. 127.0.0.1:8080")
    host = host.strip("[]")
    local = is_loopback(host)
    if not local and not read_only:
        click.echo(f"cyclone: {host} is not a loopback address: serving read-only", err=True)

    async def go(client: Client) -> None:
        read_only_now = True if read_only or not local else None
        app = make_dashboard(client, read_only=read_only_now, title=title)
        config = uvicorn.Config(
            app, log_level="warning", lifespan="off", timeout_graceful_shutdown=5
        )
        try:  # listening before it says so: a client may connect right after the line
            sock = socket.create_server((host, int(port_text)))
        except OSError as exc:
            raise Failure(f"cannot listen on {bind}: {exc}") from None
        click.echo(f"cyclone: dashboard on http://{bind}/ ; Ctrl-C stops it", err=True)
        await uvicorn.Server(config).serve(sockets=[sock])

    try:
        _run(_with_client(ctx, go, connections=8))
    except KeyboardInterrupt:  # uvicorn hands the SIGINT it handled back on the way out
        click.echo("cyclone: dashboard stopped", err=True)


# Schedules (cyclone/_scheduler.py): list, pause, resume and trigger stored schedules.


@main.group()
@_connection_options(top=False)
def schedules() -> None:
    """List, pause, resume and trigger schedules."""


@schedules.command("ls")
@click.option("--json", "as_json", is_flag=True)
@_connection_options(top=False)
@click.pass_context
def schedules_ls(ctx: click.Context, as_json: bool) -> None:
    """List stored schedules: timing, target, state and next slot."""
    rows = _run(_with_client(ctx, lambda c: c.schedules.list()))
    if as_json:
        _json([asdict(r) for r in rows])
        return
    table = Table("name", "when", "target", "state", "next slot", "last run")
    for r in rows:
        when = f"cron {r.cron!r} {r.tz}" if r.cron is not None else f"every {r.every}"
        state = "paused" if r.paused else "active"
        if not r.declared:
            state += " (undeclared)"  # no running worker declares it: nobody fires it
        origin = "dynamic" if r.dynamic else "declared"
        last = "" if r.last_run_id is None else str(r.last_run_id)
        _add_row(table, r.name, when, r.target, f"{state}, {origin}", f"{r.next_at:%F %T%z}", last)
    console.print(table)


@schedules.command("pause")
@click.argument("name")
@_connection_options(top=False)
@click.pass_context
def schedules_pause(ctx: click.Context, name: str) -> None:
    """Stop making runs for NAME until it is resumed (kept across deploys)."""
    _run(_with_client(ctx, lambda c: c.schedules.pause(name)))
    click.echo(f"paused {name}")


@schedules.command("resume")
@click.argument("name")
@_connection_options(top=False)
@click.pass_context
def schedules_resume(ctx: click.Context, name: str) -> None:
    """Make runs for NAME again from its next slot; slots passed while paused are not run."""
    _run(_with_client(ctx, lambda c: c.schedules.resume(name)))
    click.echo(f"resumed {name}")


@schedules.command("trigger")
@click.argument("name")
@_connection_options(top=False)
@click.pass_context
def schedules_trigger(ctx: click.Context, name: str) -> None:
    """Ask for one run of NAME now; prints the run's key (`cyclone runs ls --key KEY`)."""
    key = _run(_with_client(ctx, lambda c: c.schedules.trigger(name)))
    click.echo(key)


# Flow control (docs/flow-control.md): cyclone queues ls|pause|resume|limit.


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


@main.group()
@_connection_options(top=False)
def queues() -> None:
    """Pause, resume and limit queues across every worker."""


@queues.command("ls")
@click.option("--json", "as_json", is_flag=True)
@_connection_options(top=False)
@click.pass_context
def queues_ls(ctx: click.Context, as_json: bool) -> None:
    """The queues that are paused or limited, and the kinds with limits."""

    async def read(c: Client) -> tuple[list[Any], dict[str, Any]]:
        return await c.queues.list(), await c.queues.kind_limits()

    settings, kinds = _run(_with_client(ctx, read))
    if as_json:
        _json(
            {
                "queues": [asdict(s) for s in settings],
                "kinds": {k: asdict(v) for k, v in kinds.items()},
            }
        )
        return
    table = Table("queue or kind", "flow control")
    for s in settings:
        lim = s.limits
        rate = None if lim.rate is None else (lim.rate, lim.per)
        key_rate = None if lim.key_rate is None else (lim.key_rate, lim.key_per)
        text = _flow_text(s.paused, lim.concurrency, rate, lim.key_concurrency, key_rate)
        _add_row(table, s.queue, text)
    for kind, k in kinds.items():
        rate = None if k.rate is None else (k.rate, k.per)
        _add_row(table, f"kind {kind}", _flow_text(False, k.concurrency, rate, None))
    console.print(table)


@queues.command("pause")
@click.argument("queue")
@click.option("--create", is_flag=True, help="Also a queue no worker claims from yet.")
@_connection_options(top=False)
@click.pass_context
def queues_pause(ctx: click.Context, queue: str, create: bool) -> None:
    """Stop every worker claiming from QUEUE; running work finishes."""
    changed = _run(_with_client(ctx, lambda c: c.queues.pause(queue, create=create)))
    click.echo(f"paused {queue}" if changed else f"{queue} was paused already")


@queues.command("resume")
@click.argument("queue")
@_connection_options(top=False)
@click.pass_context
def queues_resume(ctx: click.Context, queue: str) -> None:
    """Let workers claim from QUEUE again (they are woken at once)."""
    changed = _run(_with_client(ctx, lambda c: c.queues.resume(queue)))
    click.echo(f"resumed {queue}" if changed else f"{queue} was not paused")


@queues.command("limit")
@click.argument("queue")
@click.option("--concurrency", type=int, help="Tasks running at once, all workers.")
@click.option("--rate", type=int, help="Starts per --per.")
@click.option("--per", type=float, help="The rate's period in seconds.")
@click.option("--key-concurrency", type=int, help="Tasks running at once per group key.")
@click.option("--key-rate", type=int, help="Starts per --key-per of each group key.")
@click.option("--key-per", type=float, help="The per-key rate's period in seconds.")
@click.option("--kind", is_flag=True, help="QUEUE names a kind: limit it on every queue.")
@click.option("--create", is_flag=True, help="Also a queue no worker claims from yet.")
@_connection_options(top=False)
@click.pass_context
def queues_limit(
    ctx: click.Context,
    queue: str,
    concurrency: int | None,
    rate: int | None,
    per: float | None,
    key_concurrency: int | None,
    key_rate: int | None,
    key_per: float | None,
    kind: bool,
    create: bool,
) -> None:
    """Replace QUEUE's limits (a limit not given is cleared; none given clears them all)."""
    if kind:
        if key_concurrency is not None or key_rate is not None or key_per is not None:
            raise click.UsageError(
                "--key-concurrency, --key-rate and --key-per apply to a queue, not to a kind"
            )
        _run(
            _with_client(
                ctx,
                lambda c: c.queues.set_kind_limits(
                    queue, concurrency=concurrency, rate=rate, per=per
                ),
            )
        )
    else:
        _run(
            _with_client(
                ctx,
                lambda c: c.queues.set_limits(
                    queue,
                    concurrency=concurrency,
                    rate=rate,
                    per=per,
                    key_concurrency=key_concurrency,
                    key_rate=key_rate,
                    key_per=key_per,
                    create=create,
                ),
            )
        )
    rate_pair = None if rate is None or per is None else (rate, per)
    key_pair = None if key_rate is None or key_per is None else (key_rate, key_per)
    text = _flow_text(False, concurrency, rate_pair, key_concurrency, key_pair) or "no limits"
    click.echo(f"{'kind ' if kind else ''}{queue}: {text}")
