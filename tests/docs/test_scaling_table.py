"""docs/scaling.md's statement-by-statement table covers every statement Cyclone sends, and
names none that is gone: a statement added without saying how it would shard fails here."""

from __future__ import annotations

import pathlib
import re
from importlib import resources

from cyclone._storage import loader

DOC = pathlib.Path(__file__).parents[2] / "docs" / "scaling.md"


def _table_names() -> set[str]:
    text = DOC.read_text()
    table = text[text.index("### Statement by statement") :]
    table = table[: table.index("\n### ", 1)]
    rows = [line for line in table.splitlines() if line.startswith("| `")]
    return {name for row in rows for name in re.findall(r"`([a-z_]+)`", row.split("|")[1])}


def test_the_scaling_table_lists_every_statement() -> None:
    statements = set(loader.parse_folder(resources.files("cyclone._storage").joinpath("sql")))
    listed = _table_names()
    assert sorted(statements - listed) == [], "add these to docs/scaling.md's table"
    assert sorted(listed - statements) == [], "these are in docs/scaling.md but not in the SQL"
