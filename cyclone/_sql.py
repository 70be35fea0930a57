"""Cyclone's SQL: named queries and migrations, read once from ``sql/`` at import.

``queries.sql`` holds every run-time statement under a ``-- name: noun_verb`` header;
``migrations/NNNN_name.sql`` are applied in order by :func:`cyclone.Client.migrate`.
``__schema__`` in the text stands for the client's schema, validated and quoted here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib import resources

_NAME = re.compile(r"^-- name: (\w+)\s*$", re.MULTILINE)
# 55 characters at most: the notification channel "cyclone_<schema>" must fit in 63.
_IDENTIFIER = re.compile(r"^[a-z_][a-z0-9_]{0,54}$")
_SCHEMA_TOKEN = "__schema__"


def _read(name: str) -> str:
    return resources.files("cyclone").joinpath("sql").joinpath(name).read_text("utf-8")


def _parse(text: str) -> dict[str, str]:
    parts = _NAME.split(text)
    # parts: [preamble, name1, body1, name2, body2, ...]
    queries = {}
    for name, body in zip(parts[1::2], parts[2::2], strict=True):
        if name in queries:
            raise RuntimeError(f"query {name} is defined twice in queries.sql")
        queries[name] = body.strip()
    return queries


_QUERIES = _parse(_read("queries.sql"))


@dataclass(frozen=True)
class Migration:
    """One versioned migration file."""

    version: int
    name: str
    sql: str


def _migrations() -> tuple[Migration, ...]:
    folder = resources.files("cyclone").joinpath("sql").joinpath("migrations")
    found = []
    for entry in folder.iterdir():
        match = re.fullmatch(r"(\d{4})_(\w+)\.sql", entry.name)
        if match:
            found.append(Migration(int(match[1]), match[2], entry.read_text("utf-8")))
    found.sort(key=lambda m: m.version)
    return tuple(found)


MIGRATIONS = _migrations()


def validate_identifier(value: str, *, what: str) -> str:
    """Return ``value`` if it is a plain lower-case SQL identifier, else raise ValueError."""
    if not isinstance(value, str) or not _IDENTIFIER.fullmatch(value):
        raise ValueError(
            f"{what} must be a lower-case identifier (letters, digits, _; at most 55), "
            f"got {value!r}"
        )
    return value


class Queries:
    """The named queries with the schema filled in, one instance per client."""

    def __init__(self, schema: str) -> None:
        self.schema = validate_identifier(schema, what="schema")
        quoted = f'"{schema}"'
        self._text = {name: sql.replace(_SCHEMA_TOKEN, quoted) for name, sql in _QUERIES.items()}
        self.migrations = tuple(
            Migration(m.version, m.name, m.sql.replace(_SCHEMA_TOKEN, quoted)) for m in MIGRATIONS
        )

    def __getitem__(self, name: str) -> str:
        return self._text[name]
