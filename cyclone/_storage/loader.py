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

A statement's next line may say the schema generation it needs, the migration that added
the newest table or column it uses: ``-- needs: 0009`` (``sql/README.md``, "Schema
generations"). The loader refuses a generation no migration has, and a statement that uses
a table, or a column of a table it names, that a later migration added: the tables it
names, the columns its ``INSERT`` lists write, and the ``alias.column`` references to a
table it names with an alias. A column named without its table's alias is not checked.

Two tokens are filled in per client (:class:`Queries`): ``__schema__``, the client's
schema, validated and quoted; ``__now__``, the clock (``now()``, unless a test moves it).
``migrations/NNNN_name.sql`` are applied in order by :func:`cyclone.Client.migrate`, as they
are (they are the schema's history: only ``__schema__`` is filled in). One whose first line
is ``-- apply: concurrently`` holds only index builds (``CREATE INDEX CONCURRENTLY IF NOT
EXISTS``) and drops, applied outside a transaction, one statement at a time.

A statement the loader cannot read (a parameter used but not declared, or declared and not
used, a positional ``$1``, a malformed name, a generation it does not keep to) raises
:class:`SqlLoadError` at import.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from importlib.resources.abc import Traversable

from cyclone._model.errors import InvalidNameError

_HEADER = re.compile(r"^-- (name|fragment): (\w+)(?:\(([^)]*)\))?[ \t]*$", re.MULTILINE)
_HEADER_LIKE = re.compile(r"^-- (?:name|fragment):.*$", re.MULTILINE)
_INCLUDE = re.compile(r"/\* fragment: (\w+) \*/")
_NEEDS = re.compile(r"\A\n?-- needs: (\d{4})[ \t]*(?:\n|\Z)")
_NEEDS_LIKE = re.compile(r"^-- needs:.*$", re.MULTILINE)
# What a migration adds that a statement names: a table, or a column of an older table.
_TABLE_CREATED = re.compile(
    r"\bCREATE\s+TABLE\s+(?:IF\s+NOT\s+EXISTS\s+)?__schema__\.(\w+)", re.IGNORECASE
)
_TABLE_ALTERED = re.compile(
    r"\bALTER\s+TABLE\s+(?:IF\s+EXISTS\s+)?(?:ONLY\s+)?__schema__\.(\w+)([^;]*)", re.IGNORECASE
)
_COLUMN_ADDED = re.compile(r"\bADD\s+COLUMN\s+(?:IF\s+NOT\s+EXISTS\s+)?(\w+)", re.IGNORECASE)
# What a statement names: a table (and its alias, if any), the columns an INSERT lists, and
# alias.column references.
_TABLE_NAMED = re.compile(
    r"__schema__\.(\w+)(?:\s+(?:AS\s+)?(?!(?:AS|CROSS|DEFAULT|DO|EXCEPT|FETCH|FOR|FROM|FULL|"
    r"GROUP|HAVING|INNER|INTERSECT|JOIN|LEFT|LIMIT|NATURAL|OFFSET|ON|ORDER|RETURNING|RIGHT|"
    r"SELECT|SET|UNION|USING|VALUES|WHERE|WINDOW|WITH)\b)([a-z_]\w*))?",
    re.IGNORECASE,
)
_INSERT_COLUMNS = re.compile(
    r"\bINSERT\s+INTO\s+__schema__\.(\w+)(?:\s+AS\s+\w+)?\s*\(([^)]*)\)", re.IGNORECASE
)
_QUALIFIED = re.compile(r"(?<![\w.])([a-z_]\w*)\.([a-z_]\w*)", re.IGNORECASE)
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
    but its name; ``__schema__`` and ``__now__`` still in it), the name of each ``$n`` in
    order, and the schema generation it declares it needs (a migration's version), if any."""

    sql: str
    params: tuple[str, ...]
    needs: int | None = None


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


def parse_folder(
    folder: Traversable, migrations: Sequence[Migration] | None = None
) -> dict[str, Statement]:
    """The named statements of every ``*.sql`` file directly in ``folder``, their fragments
    filled in, their parameters numbered and their generations checked against
    ``migrations`` (by default, those of ``folder``'s ``migrations/``)."""
    if migrations is None:
        migrations = read_migrations(folder.joinpath("migrations"))
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
                if _NEEDS_LIKE.search(body):
                    raise SqlLoadError(f"fragment {name}: only a statement says what it needs")
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

    added = _added(migrations)
    found = {}
    for name, (body, params) in bodies.items():
        statement = compile_statement(name, fill(body, (name,)), params)
        needs = _NEEDS.match(body)
        if _NEEDS_LIKE.search(body[needs.end() if needs else 0 :]):
            raise SqlLoadError(f"{name}: -- needs: NNNN goes on the line after its name")
        if needs is not None:
            statement = Statement(statement.sql, params, int(needs[1]))
            _check_generation(name, statement, added, {m.version for m in migrations})
        found[name] = statement
    return found


def _added(migrations: Sequence[Migration]) -> dict[tuple[str, str | None], int]:
    """The migration that added each table, (table, None), and each column added to a table
    after it was created, (table, column)."""
    added: dict[tuple[str, str | None], int] = {}
    for m in migrations:
        code = re.sub(r"--[^\n]*", "", m.sql)
        for table in _TABLE_CREATED.findall(code):
            added.setdefault((table.lower(), None), m.version)
        for table, change in _TABLE_ALTERED.findall(code):
            for column in _COLUMN_ADDED.findall(change):
                added.setdefault((table.lower(), column.lower()), m.version)
    return added


def _check_generation(
    name: str,
    statement: Statement,
    added: Mapping[tuple[str, str | None], int],
    versions: set[int],
) -> None:
    """Refuse ``statement`` if it declares a generation no migration has, or uses a table or
    a column (an INSERT's, or ``alias.column``) that a later migration added."""
    assert statement.needs is not None
    if statement.needs not in versions:
        raise SqlLoadError(f"{name}: needs {statement.needs:04d}, which is no migration")
    code = re.sub(r"'(?:[^']|'')*'", "''", statement.sql.partition("\n")[2])
    used: set[tuple[str, str | None]] = set()
    aliases: dict[str, set[str]] = {}
    for table, alias in _TABLE_NAMED.findall(code):
        used.add((table.lower(), None))
        if alias:
            aliases.setdefault(alias.lower(), set()).add(table.lower())
    for table, columns in _INSERT_COLUMNS.findall(code):
        used.update((table.lower(), c.strip().lower()) for c in columns.split(","))
    for alias, column in _QUALIFIED.findall(code):
        used.update((t, column.lower()) for t in aliases.get(alias.lower(), ()))
    for thing in sorted(used, key=str):
        version = added.get(thing)
        if version is not None and version > statement.needs:
            what = thing[0] if thing[1] is None else f"{thing[0]}.{thing[1]}"
            raise SqlLoadError(
                f"{name}: needs {statement.needs:04d} but uses {what}, "
                f"added by migration {version:04d}"
            )


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


def read_migrations(folder: Traversable) -> tuple[Migration, ...]:
    """The migrations in ``folder`` (``NNNN_name.sql``), in order; none if it is no folder."""
    if not folder.is_dir():
        return ()
    found = []
    for entry in folder.iterdir():
        match = re.fullmatch(r"(\d{4})_(\w+)\.sql", entry.name)
        if match:
            found.append(parse_migration(int(match[1]), match[2], entry.read_text("utf-8")))
    found.sort(key=lambda m: m.version)
    return tuple(found)


_SQL = resources.files("cyclone._storage").joinpath("sql")
MIGRATIONS = read_migrations(_SQL.joinpath("migrations"))
_STATEMENTS = parse_folder(_SQL, MIGRATIONS)


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
