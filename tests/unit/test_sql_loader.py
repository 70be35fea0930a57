"""The SQL loader: named statements from every file of a folder, each name once."""

from __future__ import annotations

from pathlib import Path

import pytest

from cyclone._sql import parse_folder


def test_statements_come_from_every_sql_file(tmp_path: Path) -> None:
    (tmp_path / "a.sql").write_text("-- name: one\nSELECT 1;\n")
    (tmp_path / "b.sql").write_text(
        "-- preamble\n-- name: two\nSELECT 2;\n-- name: three\nSELECT 3;"
    )
    (tmp_path / "notes.txt").write_text("-- name: ignored\nSELECT 0;")
    assert parse_folder(tmp_path) == {"one": "SELECT 1;", "two": "SELECT 2;", "three": "SELECT 3;"}


def test_a_name_defined_in_two_files_is_refused(tmp_path: Path) -> None:
    (tmp_path / "a.sql").write_text("-- name: one\nSELECT 1;\n")
    (tmp_path / "b.sql").write_text("-- name: one\nSELECT 2;\n")
    with pytest.raises(RuntimeError, match=r"query one is defined twice in sql/ \(b.sql\)"):
        parse_folder(tmp_path)


def test_a_fragment_is_shared_text_not_a_statement(tmp_path: Path) -> None:
    (tmp_path / "a.sql").write_text(
        "-- fragment: evens\n-- why it is so\nFROM t WHERE n % 2 = 0\n\n"
        "-- name: evens_list\nSELECT n /* fragment: evens */ ORDER BY n;\n"
        "-- name: evens_count\nSELECT count(*) /* fragment: evens */;\n"
    )
    assert parse_folder(tmp_path) == {
        "evens_list": "SELECT n \n-- why it is so\nFROM t WHERE n % 2 = 0\n ORDER BY n;",
        "evens_count": "SELECT count(*) \n-- why it is so\nFROM t WHERE n % 2 = 0\n;",
    }


def test_an_unknown_fragment_is_refused(tmp_path: Path) -> None:
    (tmp_path / "a.sql").write_text("-- name: one\nSELECT 1 /* fragment: nowhere */;\n")
    with pytest.raises(RuntimeError, match="unknown fragment nowhere in sql/"):
        parse_folder(tmp_path)
