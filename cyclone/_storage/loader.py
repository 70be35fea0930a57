"""Cyclone's SQL: named statements and migrations, read once from ``sql/`` at import.

Every ``sql/*.sql`` file holds run-time statements, one per pipeline stage or feature (see
``sql/README.md``). A statement starts at a header that names it and declares its parameters
in order, like a function: ``-- name: task_heartbeat(run_ids, ids, claims, lease)``; a long
list may go on over the next ``--`` lines until its ``)``. Its text refers to them as
``:name``; the loader numbers them ``$1``, ``$2``... in the declared order (a name used twice
is one parameter), so the server gets its own placeholders, and a wrapper in ``queries``
binds its values by name (:meth:`Queries.bind`). ``::type`` casts and the text of comments,
strings and quoted identifiers are never parameters. Each name is defined once across the
files. The comments are for readers of the files: the server gets each statement without
them, named by a first line ``-- cyclone: <name>`` (as pg_stat_statements shows it). A shorter
text parses faster, and asyncpg prepares and caches only statements of up to 15 KiB
(``max_cacheable_statement_size``): a longer one is planned anew on every execution.

A ``-- fragment: name`` header defines shared text that is not a statement of its own:
``/* fragment: name */`` in a statement (or in another fragment) stands for it.

Two tokens are filled in per client (:class:`Queries`): ``__schema__``, the client's
schema, validated and quoted; ``__now__``, the clock (``now()``, unless a test moves it).
``migrations/NNNN_name.sql`` are applied in order by :func:`cyclone.Client.migrate`, as they
are (they are the schema's history: only ``__schema__`` is filled in). One whose first line
is ``-- apply: concurrently`` holds only index builds (``CREATE INDEX CONCURRENTLY IF NOT
EXISTS``) and drops, applied outside a transaction, one statement at a time.

A statement the loader cannot read (a parameter used but not declared, or declared and not
used, a positional ``$1``, a malformed name) raises :class:`SqlLoadError` at import.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from importlib.resources.abc import Traversable

from cyclone._model.errors import InvalidNameError

_HEADER = re.compile(r"^-- (name|fragment): (\w+)(?:\(([^)]*)\))?[ \t]*$", re.MULTILINE)
_HEADER_LIKE = re.compile(r"^-- (?:name|fragment):.*$", re.MULTILINE)
_INCLUDE = re.compile(r"/\* fragment: (\w+) \*/")
# What a statement's text is made of, as far as parameters go: comments, strings and quoted
# identifiers (left as they are), casts, named and positional parameters.
_TOKEN = re.compile(
    r"""--[^\n]*
      | /\*.*?\*/
      | '(?:[^']|'')*'
      | "(?:[^"]|"")*"
      | ::
      | :(?P<named>\w+)
      | \$(?P<positional>\d+)
    """,
    re.DOTALL | re.VERBOSE,
)
# What removing comments leaves to tidy, outside strings and quoted identifiers (kept as
# they are, line breaks and spaces included): spaces that end a line, and empty lines.
_LAYOUT = re.compile(
    r"""'(?:[^']|'')*'
      | "(?:[^"]|"")*"
      | \n[ \t]*(?=\n)
      | [ \t]+(?=\n|$)
    """,
    re.VERBOSE,
)
_PARAMETER = re.compile(r"[a-z_][a-z0-9_]*")
# 55 characters at most: the notification channel "cyclone_<schema>" must fit in 63.
_IDENTIFIER = re.compile(r"^[a-z_][a-z0-9_]{0,54}$")
_SCHEMA_TOKEN = "__schema__"
_CLOCK_TOKEN = "__now__"
DEFAULT_CLOCK = "now()"


class SqlLoadError(RuntimeError):
    """A statement file Cyclone's loader refuses: a defect of Cyclone's own SQL, raised when
    the file is read (at import, for the package's files)."""


@dataclass(frozen=True)
class Statement:
    """One named statement: its text as the server gets it (``$n`` placeholders, no comments
    but its name; ``__schema__`` and ``__now__`` still in it), and the name of each ``$n``
    in order."""

    sql: str
    params: tuple[str, ...]


def _declared(name: str, signature: str | None) -> tuple[str, ...]:
    if signature is None:
        return ()
    text = signature.replace("\n--", " ")
    if "\n" in text:
        raise SqlLoadError(f"{name}: its parameter list goes on over a line not starting --")
    params = tuple(p.strip() for p in text.split(",")) if text.strip() else ()
    for p in params:
        if not _PARAMETER.fullmatch(p):
            raise SqlLoadError(f"{name}: {p!r} is not a parameter name (lower-case, digits, _)")
    if len(set(params)) != len(params):
        raise SqlLoadError(f"{name}: a parameter is declared twice in {params}")
    return params


def compile_statement(name: str, text: str, params: tuple[str, ...]) -> Statement:
    """``text`` with each ``:param`` (declared in ``params``) replaced by its ``$n``."""
    number = {p: i for i, p in enumerate(params, start=1)}
    used: set[str] = set()

    def replace(match: re.Match[str]) -> str:
        if match["positional"] is not None:
            raise SqlLoadError(
                f"{name}: ${match['positional']} is positional; name it (:name) and declare it"
            )
        param = match["named"]
        if param is None:
            return "" if match[0].startswith(("--", "/*")) else match[0]
        if not _PARAMETER.fullmatch(param):
            raise SqlLoadError(f"{name}: :{param} is not a parameter name (lower-case, digits, _)")
        if param not in number:
            raise SqlLoadError(f"{name}: :{param} is not declared in its header")
        used.add(param)
        return f"${number[param]}"

    bare = _LAYOUT.sub(lambda m: m[0] if m[0][0] in "'\"" else "", _TOKEN.sub(replace, text))
    sql = f"-- cyclone: {name}\n{bare.strip()}"
    unused = [p for p in params if p not in used]
    if unused:
        raise SqlLoadError(f"{name}: declares {', '.join(unused)} but never uses it")
    return Statement(sql, params)


def parse_folder(folder: Traversable) -> dict[str, Statement]:
    """The named statements of every ``*.sql`` file directly in ``folder``, their fragments
    filled in and their parameters numbered."""
    bodies: dict[str, tuple[str, tuple[str, ...]]] = {}
    fragments: dict[str, str] = {}
    for entry in sorted(folder.iterdir(), key=lambda e: e.name):
        if not entry.name.endswith(".sql"):
            continue
        text = entry.read_text("utf-8")
        headers = {m.start() for m in _HEADER.finditer(text)}
        for like in _HEADER_LIKE.finditer(text):
            if like.start() not in headers:  # else it would be read as a comment
                raise SqlLoadError(f"{entry.name}: not a header: {like[0]!r}")
        parts = _HEADER.split(text)
        # parts: [preamble, what1, name1, signature1, body1, what2, ...]
        for what, name, signature, body in zip(
            parts[1::4], parts[2::4], parts[3::4], parts[4::4], strict=True
        ):
            if name in bodies or name in fragments:
                raise SqlLoadError(f"query {name} is defined twice in sql/ ({entry.name})")
            if what == "fragment":
                if signature is not None:
                    raise SqlLoadError(f"fragment {name}: its statements declare parameters")
                fragments[name] = body.strip()
            else:
                bodies[name] = (body.strip(), _declared(name, signature))

    def fill(text: str, within: tuple[str, ...]) -> str:
        def include(match: re.Match[str]) -> str:
            if match[1] not in fragments:
                raise SqlLoadError(f"unknown fragment {match[1]} in sql/")
            if match[1] in within:
                raise SqlLoadError(f"fragment {match[1]} includes itself ({' > '.join(within)})")
            # On lines of its own: a comment ends in it.
            return f"\n{fill(fragments[match[1]], (*within, match[1]))}\n"

        return _INCLUDE.sub(include, text)

    return {
        name: compile_statement(name, fill(body, (name,)), params)
        for name, (body, params) in bodies.items()
    }


_STATEMENTS = parse_folder(resources.files("cyclone._storage").joinpath("sql"))


CONCURRENTLY = "-- apply: concurrently"
"""The first line of a migration applied outside a transaction, one statement at a time."""

_INDEX_BUILD = re.compile(
    r"CREATE (?:UNIQUE )?INDEX CONCURRENTLY IF NOT EXISTS (\w+) ON __schema__\.\w+ .*"
    r"|DROP INDEX CONCURRENTLY IF EXISTS __schema__\.\w+",
    re.DOTALL,
)
_DROP_INVALID = "DROP INDEX CONCURRENTLY IF EXISTS __schema__.{index}"


@dataclass(frozen=True)
class Build:
    """One statement of a concurrent migration; ``index``: the index a ``CREATE`` builds
    (an invalid one of that name, left by a build that failed, is dropped before it)."""

    sql: str
    index: str | None


@dataclass(frozen=True)
class Migration:
    """One versioned migration file. ``builds``: the statements of a concurrent migration
    (its first line :data:`CONCURRENTLY`), empty for one applied in the migrating
    transaction."""

    version: int
    name: str
    sql: str
    builds: tuple[Build, ...] = ()


def parse_migration(version: int, name: str, text: str) -> Migration:
    """A migration from its file's text; :class:`SqlLoadError` for a concurrent one with a
    statement other than an index built or dropped concurrently, idempotently
    (``CREATE INDEX CONCURRENTLY IF NOT EXISTS``, ``DROP INDEX CONCURRENTLY IF EXISTS``)."""
    if not text.startswith(CONCURRENTLY + "\n"):
        return Migration(version, name, text)
    code = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("--"))
    builds = []
    for statement in filter(None, (" ".join(s.split()) for s in code.split(";"))):
        match = _INDEX_BUILD.fullmatch(statement)
        if match is None:
            raise SqlLoadError(
                f"migration {version:04d}_{name}: a concurrent migration only builds or drops "
                f"indexes, concurrently and idempotently, not {statement[:60]!r}"
            )
        builds.append(Build(statement, match[1]))
    return Migration(version, name, text, tuple(builds))


def _migrations() -> tuple[Migration, ...]:
    folder = resources.files("cyclone._storage").joinpath("sql").joinpath("migrations")
    found = []
    for entry in folder.iterdir():
        match = re.fullmatch(r"(\d{4})_(\w+)\.sql", entry.name)
        if match:
            found.append(parse_migration(int(match[1]), match[2], entry.read_text("utf-8")))
    found.sort(key=lambda m: m.version)
    return tuple(found)


MIGRATIONS = _migrations()


def validate_identifier(value: str, *, what: str) -> str:
    """Return ``value`` if it is a plain lower-case SQL identifier, else raise
    :class:`InvalidNameError` (a ``ValueError``)."""
    if not isinstance(value, str) or not _IDENTIFIER.fullmatch(value):
        raise InvalidNameError(
            f"{what} must be a lower-case identifier (letters, digits, _; at most 55), "
            f"got {value!r}"
        )
    return value


class Queries:
    """The named statements with the schema and the clock filled in, one instance per client.

    ``clock`` is the SQL expression every statement reads the time from (``now()``, the
    transaction's start). A test may pass another ``timestamptz`` expression, such as
    ``now() + current_setting('cyclone.test_offset')::interval``, to move Cyclone's time
    without waiting; production code never does. Column defaults of the migrations (a
    row's ``created_at``) keep the real time.
    """

    def __init__(self, schema: str, *, clock: str = DEFAULT_CLOCK) -> None:
        self.schema = validate_identifier(schema, what="schema")
        self.clock = clock
        quoted = f'"{schema}"'
        now = clock if clock == DEFAULT_CLOCK else f"({clock})"
        self._statements = _STATEMENTS
        self._text = {
            name: s.sql.replace(_SCHEMA_TOKEN, quoted).replace(_CLOCK_TOKEN, now)
            for name, s in _STATEMENTS.items()
        }
        self._params = {name: frozenset(s.params) for name, s in _STATEMENTS.items()}
        self.migrations = tuple(self.migration(m) for m in MIGRATIONS)

    def __getitem__(self, name: str) -> str:
        return self._text[name]

    def migration(self, m: Migration) -> Migration:
        """Migration ``m`` with this client's schema filled in."""
        quoted = f'"{self.schema}"'
        builds = tuple(Build(b.sql.replace(_SCHEMA_TOKEN, quoted), b.index) for b in m.builds)
        return Migration(m.version, m.name, m.sql.replace(_SCHEMA_TOKEN, quoted), builds)

    def index_drop(self, index: str) -> str:
        """The statement that drops ``index`` (an invalid leftover of a concurrent build)."""
        name = validate_identifier(index, what="index")
        return _DROP_INVALID.format(index=name).replace(_SCHEMA_TOKEN, f'"{self.schema}"')

    def bind(self, name: str, values: Mapping[str, object]) -> tuple[str, list[object]]:
        """Statement ``name``'s text and its arguments in ``$n`` order, from ``values`` by
        parameter name; a ``TypeError`` unless they are exactly the declared parameters."""
        if values.keys() != self._params[name]:
            declared = ", ".join(self._statements[name].params)
            raise TypeError(f"{name} takes ({declared}), not ({', '.join(values)})")
        return self._text[name], [values[p] for p in self._statements[name].params]
