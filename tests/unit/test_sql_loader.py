"""The SQL loader: named statements from every file of a folder, each name once; named
parameters numbered at load time; the clock filled in per client."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from cyclone._storage.loader import _STATEMENTS, Queries, SqlLoadError, Statement, parse_folder


def texts(folder: Path) -> dict[str, str]:
    """Each statement as the server gets it, less its first line, which names it."""
    found = {}
    for name, statement in parse_folder(folder).items():
        first, _, rest = statement.sql.partition("\n")
        assert first == f"-- cyclone: {name}"
        found[name] = rest
    return found


def test_statements_come_from_every_sql_file(tmp_path: Path) -> None:
    (tmp_path / "a.sql").write_text("-- name: one\nSELECT 1;\n")
    (tmp_path / "b.sql").write_text(
        "-- preamble\n-- name: two\nSELECT 2;\n-- name: three\nSELECT 3;"
    )
    (tmp_path / "notes.txt").write_text("-- name: ignored\nSELECT 0;")
    assert texts(tmp_path) == {"one": "SELECT 1;", "two": "SELECT 2;", "three": "SELECT 3;"}


def test_a_name_defined_in_two_files_is_refused(tmp_path: Path) -> None:
    (tmp_path / "a.sql").write_text("-- name: one\nSELECT 1;\n")
    (tmp_path / "b.sql").write_text("-- name: one\nSELECT 2;\n")
    with pytest.raises(SqlLoadError, match=r"query one is defined twice in sql/ \(b.sql\)"):
        parse_folder(tmp_path)


def test_a_fragment_is_shared_text_not_a_statement(tmp_path: Path) -> None:
    (tmp_path / "a.sql").write_text(
        "-- fragment: evens\n-- why it is so\nFROM t WHERE n % 2 = 0\n\n"
        "-- name: evens_list\nSELECT n /* fragment: evens */ ORDER BY n;\n"
        "-- name: evens_count\nSELECT count(*) /* fragment: evens */;\n"
    )
    assert texts(tmp_path) == {
        "evens_list": "SELECT n\nFROM t WHERE n % 2 = 0\n ORDER BY n;",
        "evens_count": "SELECT count(*)\nFROM t WHERE n % 2 = 0\n;",
    }


def test_a_fragment_may_stand_in_another(tmp_path: Path) -> None:
    (tmp_path / "a.sql").write_text(
        "-- fragment: even\nn % 2 = 0\n"
        "-- fragment: evens\nFROM t WHERE /* fragment: even */\n"
        "-- name: one\nSELECT n /* fragment: evens */;\n"
    )
    assert texts(tmp_path) == {"one": "SELECT n\nFROM t WHERE\nn % 2 = 0\n;"}


def test_a_fragment_that_includes_itself_is_refused(tmp_path: Path) -> None:
    (tmp_path / "a.sql").write_text(
        "-- fragment: a\nx /* fragment: b */\n-- fragment: b\ny /* fragment: a */\n"
        "-- name: one\nSELECT /* fragment: a */;\n"
    )
    with pytest.raises(SqlLoadError, match=r"fragment a includes itself \(one > a > b\)"):
        parse_folder(tmp_path)


def test_an_unknown_fragment_is_refused(tmp_path: Path) -> None:
    (tmp_path / "a.sql").write_text("-- name: one\nSELECT 1 /* fragment: nowhere */;\n")
    with pytest.raises(SqlLoadError, match="unknown fragment nowhere in sql/"):
        parse_folder(tmp_path)


def one(tmp_path: Path, text: str) -> Statement:
    """Statement ``one`` of ``text``, less the first line of its text, which names it."""
    (tmp_path / "a.sql").write_text(text)
    found = parse_folder(tmp_path)["one"]
    first, _, rest = found.sql.partition("\n")
    assert first == "-- cyclone: one"
    return Statement(rest, found.params)


def test_named_parameters_are_numbered_in_the_declared_order(tmp_path: Path) -> None:
    found = one(
        tmp_path,
        "-- name: one(queue, kinds, limit)\n"
        "SELECT :limit::int, x FROM t WHERE q = :queue AND k = ANY (:kinds::text[])\n"
        "  AND q <> :queue;",
    )
    assert found.params == ("queue", "kinds", "limit")
    assert found.sql == (
        "SELECT $3::int, x FROM t WHERE q = $1 AND k = ANY ($2::text[])\n  AND q <> $1;"
    )


def test_a_long_parameter_list_goes_on_over_comment_lines(tmp_path: Path) -> None:
    found = one(tmp_path, "-- name: one(a, b,\n--     c)\n-- why\nSELECT :a, :b, :c;")
    assert (found.params, found.sql) == (("a", "b", "c"), "SELECT $1, $2, $3;")


def test_casts_strings_comments_and_quoted_names_are_not_parameters(tmp_path: Path) -> None:
    """Nor are comments sent: a string or quoted name holding -- or /* is not a comment."""
    text = (
        "-- name: one(n)\n"
        "-- :n and :other here are words of a comment\n"
        "SELECT ':n is -- text', 'it''s :n', \":n/*\", x::jsonb, y::text[], :n::int /* :n */\n"
        "\n"
        "FROM t WHERE a IS NOT NULL; -- :also a comment"
    )
    assert one(tmp_path, text).sql == (
        "SELECT ':n is -- text', 'it''s :n', \":n/*\", x::jsonb, y::text[], $1::int\n"
        "FROM t WHERE a IS NOT NULL;"
    )


def test_a_fragment_uses_the_parameters_of_the_statement_it_is_in(tmp_path: Path) -> None:
    (tmp_path / "a.sql").write_text(
        "-- fragment: mine\nWHERE owner = :owner\n"
        "-- name: one(owner)\nSELECT 1 /* fragment: mine */;\n"
        "-- name: two(limit, owner)\nSELECT 2 /* fragment: mine */ LIMIT :limit;\n"
    )
    assert texts(tmp_path) == {
        "one": "SELECT 1\nWHERE owner = $1\n;",
        "two": "SELECT 2\nWHERE owner = $2\n LIMIT $1;",
    }


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("-- name: one(a)\nSELECT :a, :b;", "one: :b is not declared in its header"),
        ("-- name: one(a, b)\nSELECT :a;", "one: declares b but never uses it"),
        ("-- name: one\nSELECT $1;", r"one: \$1 is positional; name it"),
        ("-- name: one(a)\nSELECT :a, $2;", r"one: \$2 is positional"),
        ("-- name: one(a)\nSELECT :a, :Queue;", "one: :Queue is not a parameter name"),
        ("-- name: one(a)\nSELECT :a, :1st;", "one: :1st is not a parameter name"),
        ("-- name: one(a, B)\nSELECT :a;", "one: 'B' is not a parameter name"),
        ("-- name: one(a, a)\nSELECT :a;", "one: a parameter is declared twice"),
        ("-- name: one(a,)\nSELECT :a;", "one: '' is not a parameter name"),
        ("-- name: one(a,\nb)\nSELECT :a, :b;", "one: its parameter list goes on over a line"),
        ("-- fragment: one(a)\nWHERE x = :a", "fragment one: its statements declare"),
        ("-- name: one\nSELECT 1;\n-- name: two (a)\nSELECT :a;", "a.sql: not a header"),
        ("-- name: one\nSELECT 1;\n-- name: two three\nSELECT 2;", "a.sql: not a header"),
    ],
)
def test_statements_the_loader_cannot_read_are_refused(
    tmp_path: Path, text: str, error: str
) -> None:
    (tmp_path / "a.sql").write_text(text)
    with pytest.raises(SqlLoadError, match=error):
        parse_folder(tmp_path)


def test_a_statement_binds_its_values_by_name() -> None:
    q = Queries("public")
    sql, args = q.bind("task_heartbeat", {"lease": 30.0, "ids": [1], "claims": [2], "run_ids": []})
    assert sql == q["task_heartbeat"] and args == [[], [1], [2], 30.0]
    with pytest.raises(TypeError, match=r"task_heartbeat takes \(run_ids, ids, claims, lease\)"):
        q.bind("task_heartbeat", {"lease": 30.0, "ids": [1], "claims": [2]})
    with pytest.raises(TypeError, match="task_heartbeat takes"):
        q.bind("task_heartbeat", {"lease": 1, "ids": [], "claims": [], "run_ids": [], "x": 1})


def test_the_clock_is_now_unless_a_test_moves_it() -> None:
    real, moved = Queries("public"), Queries("public", clock="now() + interval '1 hour'")
    assert "__now__" not in real["task_claim"] and "now()" in real["task_claim"]
    for name, statement in _STATEMENTS.items():
        text = statement.sql.replace("__schema__", '"public"')
        assert real[name] == text.replace("__now__", "now()")
        assert moved[name] == text.replace("__now__", "(now() + interval '1 hour')")


def test_statements_read_the_time_from_the_clock_alone() -> None:
    """No statement calls now() itself (a comment may name it), so that moving the clock
    moves all of Cyclone's time."""
    for name, statement in _STATEMENTS.items():
        code = re.sub(r"--[^\n]*|'(?:[^']|'')*'", "", statement.sql)
        assert "now()" not in code.replace("DEFAULT now()", ""), name


def test_a_string_keeps_its_lines_and_spaces_when_comments_go(tmp_path: Path) -> None:
    text = "-- name: one\nSELECT 'a  \n\n  b', \"x\n\ny\"  -- why\n\n\nFROM t;  \n"
    assert one(tmp_path, text).sql == "SELECT 'a  \n\n  b', \"x\n\ny\"\nFROM t;"


def test_every_statement_is_short_enough_for_asyncpg_to_cache_its_plan() -> None:
    """asyncpg prepares (and so the server plans once) only statements of up to
    max_cacheable_statement_size (15 KiB by default); a longer one is planned on every
    execution, which made the claim 2.2 ms slower once comments had grown it past that. The
    longest schema name Cyclone accepts lengthens every statement."""
    longest = Queries("s" * 55)
    for name in _STATEMENTS:
        assert len(longest[name].encode()) <= 15 * 1024, name


def migrations(tmp_path: Path) -> None:
    """Two migrations: a table, then a column of it and a table of its own."""
    folder = tmp_path / "migrations"
    folder.mkdir()
    (folder / "0001_init.sql").write_text("CREATE TABLE __schema__.t (id int, a text);\n")
    (folder / "0002_more.sql").write_text(
        "-- b: a column added later\nALTER TABLE __schema__.t ADD COLUMN b text,\n"
        "    ADD COLUMN IF NOT EXISTS c int;\nCREATE TABLE __schema__.u (id int);\n"
    )


def test_a_statement_says_the_generation_it_needs(tmp_path: Path) -> None:
    migrations(tmp_path)
    (tmp_path / "a.sql").write_text(
        "-- name: one(a)\n-- needs: 0001\n-- why\n"
        "INSERT INTO __schema__.t (id, a) VALUES (1, :a);\n"
        "-- name: two\n-- needs: 0002\nSELECT x.b FROM __schema__.t x;\n"
        "-- name: three\nSELECT 3;\n"
    )
    found = parse_folder(tmp_path)
    assert [found[n].needs for n in ("one", "two", "three")] == [1, 2, None]
    assert found["one"].sql == "-- cyclone: one\nINSERT INTO __schema__.t (id, a) VALUES (1, $1);"


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("-- name: one\n-- needs: 0003\nSELECT 1;", "one: needs 0003, which is no migration"),
        (
            "-- name: one\n-- needs: 0001\nSELECT 1 FROM __schema__.u;",
            "one: needs 0001 but uses u, added by migration 0002",
        ),
        (
            "-- name: one\n-- needs: 0001\nINSERT INTO __schema__.t AS r (id, b) VALUES (1, '');",
            "one: needs 0001 but uses t.b, added by migration 0002",
        ),
        (
            "-- name: one\n-- needs: 0001\nUPDATE __schema__.t x SET a = 'y' WHERE x.c = 1;",
            "one: needs 0001 but uses t.c, added by migration 0002",
        ),
        ("-- name: one\n-- why\n-- needs: 0001\nSELECT 1;", "one: -- needs: NNNN goes on the"),
        ("-- fragment: f\n-- needs: 0001\nWHERE true", "fragment f: only a statement says"),
    ],
)
def test_a_statement_that_does_not_keep_to_its_generation_is_refused(
    tmp_path: Path, text: str, error: str
) -> None:
    migrations(tmp_path)
    (tmp_path / "a.sql").write_text(text)
    with pytest.raises(SqlLoadError, match=error):
        parse_folder(tmp_path)


def test_every_insert_statement_says_the_generation_it_needs() -> None:
    """The insert path's statements are the ones a client sends: each says which schema it
    needs, one statement per insert (sql/README.md, "Schema generations")."""
    text = (Path(__file__).parents[2] / "cyclone/_storage/sql/insert.sql").read_text()
    names = re.findall(r"^-- name: (\w+)", text, re.MULTILINE)
    assert names and all(_STATEMENTS[n].needs is not None for n in names)
    assert _STATEMENTS["workflow_insert"].needs == 9  # spec, cond: migration 0009
