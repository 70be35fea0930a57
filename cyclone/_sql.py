"""Cyclone's SQL: named queries and migrations, read once from ``sql/`` at import.

Every ``sql/*.sql`` file holds run-time statements under ``-- name: noun_verb`` headers
(``queries.sql`` the core ones; a feature may keep its statements in a file of its own), each
name defined once across them all. A ``-- fragment: name`` header defines shared text that is
not a statement of its own: ``/* fragment: name */`` in a statement stands for it.
``migrations/NNNN_name.sql`` are applied in order by :func:`cyclone.Client.migrate`.
``__schema__`` in the text stands for the client's schema, validated and quoted here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib import resources
from importlib.resources.abc import Traversable

from cyclone._errors import InvalidNameError

_HEADER = re.compile(r"^-- (name|fragment): (\w+)\s*$", re.MULTILINE)
_INCLUDE = re.compile(r"/\* fragment: (\w+) \*/")
# 55 characters at most: the notification channel "cyclone_<schema>" must fit in 63.
_IDENTIFIER = re.compile(r"^[a-z_][a-z0-9_]{0,54}$")
_SCHEMA_TOKEN = "__schema__"


def parse_folder(folder: Traversable) -> dict[str, str]:
    """The named statements of every ``*.sql`` file directly in ``folder``, their fragments
    filled in."""
    found: dict[str, dict[str, str]] = {"name": {}, "fragment": {}}
    for entry in sorted(folder.iterdir(), key=lambda e: e.name):
        if not entry.name.endswith(".sql"):
            continue
        parts = _HEADER.split(entry.read_text("utf-8"))
        # parts: [preamble, what1, name1, body1, what2, name2, body2, ...]
        for what, name, body in zip(parts[1::3], parts[2::3], parts[3::3], strict=True):
            if name in found["name"] or name in found["fragment"]:
                raise RuntimeError(f"query {name} is defined twice in sql/ ({entry.name})")
            found[what][name] = body.strip()
    fragments = found["fragment"]

    def include(match: re.Match[str]) -> str:
        if match[1] not in fragments:
            raise RuntimeError(f"unknown fragment {match[1]} in sql/")
        return f"\n{fragments[match[1]]}\n"  # on lines of its own: a comment ends in it

    return {name: _INCLUDE.sub(include, body) for name, body in found["name"].items()}


_QUERIES = parse_folder(resources.files("cyclone").joinpath("sql"))


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
    """Return ``value`` if it is a plain lower-case SQL identifier, else raise
    :class:`InvalidNameError` (a ``ValueError``)."""
    if not isinstance(value, str) or not _IDENTIFIER.fullmatch(value):
        raise InvalidNameError(
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
