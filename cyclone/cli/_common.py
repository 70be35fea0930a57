"""What every command shares: the ``main`` group, the connection options, a client on a
pool of its own, one-line failures and the output helpers."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import logging
import os
import re
import sys
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import asyncpg
import click
from rich.console import Console
from rich.table import Column, Table
from rich.text import Text

from cyclone._client import Client
from cyclone._model.errors import CycloneError
from cyclone._model.keyring import Keyring
from cyclone._storage.loader import validate_identifier
from cyclone._storage.queries import DATABASE_ERRORS

T = TypeVar("T")
# Piped output is not cut to 80 columns: that width is for a terminal (or $COLUMNS).
console = Console(width=None if sys.stdout.isatty() or "COLUMNS" in os.environ else 10_000)
_DURATION = re.compile(r"^(\d+(?:\.\d+)?)([smhdw])$")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


class Failure(click.ClickException):
    """A one-line error and exit status 1."""

    def show(self, file: Any = None) -> None:
        click.echo(f"cyclone: {self.message}", err=True)


def parse_duration(text: str) -> dt.timedelta:
    """``90s``, ``15m``, ``12h``, ``7d``, ``2w`` as a timedelta."""
    match = _DURATION.fullmatch(text.strip())
    if not match:
        raise Failure(f"{text!r} is not a duration like 90s, 15m, 12h, 7d or 2w")
    return dt.timedelta(seconds=float(match[1]) * _UNITS[match[2]])


def with_client(
    ctx: click.Context,
    use: Callable[[Client], Awaitable[T]],
    *,
    connections: int = 4,
    check: bool = True,
    lazy: bool = False,
) -> T:
    """Run ``use`` with a client on a pool of its own, to its end; Cyclone's and the
    database's errors become a :class:`Failure`. ``check``: refuse an unmigrated schema;
    ``lazy``: connect on first use (a worker may start before the database does)."""
    try:
        return asyncio.run(_use_client(ctx, use, connections=connections, check=check, lazy=lazy))
    except CycloneError as exc:
        raise Failure(str(exc)) from None
    except (TimeoutError, *DATABASE_ERRORS) as exc:
        raise Failure(f"database error: {exc}") from None


async def _use_client(
    ctx: click.Context,
    use: Callable[[Client], Awaitable[T]],
    *,
    connections: int,
    check: bool,
    lazy: bool,
) -> T:
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
        # CYCLONE_KEYS, when set, seals what commands write and opens what they show.
        cipher = Keyring.from_env() if os.environ.get("CYCLONE_KEYS") else None
        client = Client(
            pool,
            schema=schema,
            notify=opts["notify"],
            listen_dsn=opts.get("listen_dsn"),
            cipher=cipher,
        )
        async with client:
            if check:
                await client.check_schema()
            return await use(client)
    finally:
        await pool.close()


def parse_run_id(text: str) -> uuid.UUID:
    try:
        return uuid.UUID(text)
    except ValueError:
        raise Failure(f"{text!r} is not a run id") from None


class Listing:
    """Rows of a listing: a table on a terminal; piped, tab-separated lines of whole values
    under a header line, for ``cut``, ``grep`` and ``awk``."""

    def __init__(self, *columns: str | Column) -> None:
        self._columns = columns
        self._rows: list[tuple[str, ...]] = []

    def add(self, *cells: str) -> None:
        """Add a row, a cell per column."""
        self._rows.append(cells)

    def print(self) -> None:
        """Print the rows: a table on a terminal, tab-separated lines otherwise."""
        if not sys.stdout.isatty():
            header = tuple(c if isinstance(c, str) else str(c.header) for c in self._columns)
            for row in (header, *self._rows):
                click.echo("\t".join(_one_field(cell) for cell in row))
            return
        table = Table(*self._columns)
        for row in self._rows:
            # Run data is not rich markup: "[x]" in an error message must print as it is.
            table.add_row(*(Text(cell) for cell in row))
        console.print(table)


def _one_field(cell: str) -> str:
    return cell.replace("\t", " ").replace("\n", " ")


def print_json(value: Any) -> None:
    click.echo(json.dumps(value, default=str, indent=2))


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


def _connection_params(*, top: bool) -> list[click.Parameter]:
    """The connection options; on a subcommand they override the group's."""
    params: list[click.Parameter] = []
    for decls, attrs in _CONNECTION_OPTIONS:
        if not top:  # the environment and the defaults are read once, by the group
            attrs = {**attrs, "envvar": None, "default": None, "show_default": False}
        else:
            attrs = {**attrs, "show_envvar": True}
        params.append(click.Option(decls, expose_value=False, callback=_store, **attrs))
    return params


@click.group(params=_connection_params(top=True))
@click.option("-v", "--verbose", is_flag=True, help="Log at INFO level.")
@click.version_option(package_name="cyclone-pg", message="cyclone-pg %(version)s")
def main(verbose: bool) -> None:
    """Cyclone: durable jobs and workflows in PostgreSQL."""
    logging.basicConfig(
        level=logging.INFO if verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )


def command(
    group: click.Group, name: str | None = None
) -> Callable[[Callable[..., None]], click.Command]:
    """A subcommand of ``group``: its own options, then the connection options; it gets the
    context (the connection options are in ``ctx.obj``) as its first argument."""

    def decorate(function: Callable[..., None]) -> click.Command:
        made = group.command(name)(click.pass_context(function))
        made.params.extend(_connection_params(top=False))
        return made

    return decorate


def subgroup(function: Callable[[], None]) -> click.Group:
    """A group of commands under ``main`` that takes the connection options too."""
    return main.group(params=_connection_params(top=False))(function)
