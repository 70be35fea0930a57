"""Test helpers: throwaway PostgreSQL servers and a pytest plugin with isolated databases.

The pytest plugin lives in :mod:`cyclone.testing.plugin` (registered as the ``cyclone`` entry
point): it gives each test a fresh database cloned from a migrated template, on one server per
test session. This package itself needs no pytest, so applications can start an embedded
PostgreSQL for local development with :func:`postgres_server`.
"""

from __future__ import annotations

from cyclone.testing._postgres import (
    PostgresServer,
    PostgresUnavailableError,
    describe,
    postgres_server,
)

__all__ = [
    "PostgresServer",
    "PostgresUnavailableError",
    "describe",
    "postgres_server",
]
