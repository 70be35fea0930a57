"""Developer sessions: ``nox -s lint typecheck tests examples docs bench chaos``."""

from __future__ import annotations

import nox

nox.options.sessions = ["lint", "typecheck", "tests"]
nox.options.default_venv_backend = "venv"


@nox.session
def lint(session: nox.Session) -> None:
    """ruff: lint and format check."""
    session.install("ruff")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")


@nox.session
def typecheck(session: nox.Session) -> None:
    """mypy --strict over the package, the examples and the typing suite (tests/typing)."""
    session.install("-e", ".[dev]")
    session.run("mypy")


@nox.session
def tests(session: nox.Session) -> None:
    """The test suite against a real PostgreSQL."""
    session.install("-e", ".[test]")
    session.run("pytest", *session.posargs)


@nox.session
def examples(session: nox.Session) -> None:
    """Run the quickstart (an embedded PostgreSQL unless CYCLONE_DATABASE_URL is set)."""
    session.install("-e", ".[embedded]")
    session.run("python", "examples/quickstart.py")


@nox.session
def docs(session: nox.Session) -> None:
    """Build the documentation site in strict mode (any warning fails)."""
    session.install("-e", ".[docs]")
    session.run("mkdocs", "build", "--strict", "-d", "site")


@nox.session
def bench(session: nox.Session) -> None:
    """The benchmarks: Cyclone beside the raw-SQL floors, PgQueuer and Procrastinate on one
    server (``nox -s bench -- --quick``, ``-- --only drain,stale``, ``-- --rounds 3``)."""
    session.install("-e", ".[test,bench]")
    session.run("python", "-m", "benchmarks", *session.posargs)


@nox.session
def chaos(session: nox.Session) -> None:
    """The fault-injection suite (tests/chaos): own PostgreSQL clusters, worker processes, an
    exact ledger. Durations from CHAOS_* environment variables (see tests/chaos)."""
    session.install("-e", ".[test]")
    session.run(
        "pytest", "tests/chaos", "--reruns", "2", "--only-rerun", "RecoveryMissed", *session.posargs
    )
