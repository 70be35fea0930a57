"""Test helpers: handler contexts without a database, throwaway PostgreSQL servers, and a
pytest plugin with isolated databases.

:func:`new_context`, :class:`TxRecorder` and :class:`StreamRecorder` unit-test a handler as a
plain coroutine.

The pytest plugin lives in :mod:`cyclone.testing.plugin` (registered as the ``cyclone`` entry
point): it gives each test a fresh database cloned from a migrated template, on one server per
test session. This package itself needs no pytest, so applications can start an embedded
PostgreSQL for local development with :func:`postgres_server`.
"""

from __future__ import annotations

from cyclone.testing._context import new_context
from cyclone.testing._postgres import (
    PostgresServer,
    PostgresUnavailableError,
    describe,
    postgres_server,
)
from cyclone.testing._recorder import (
    RecordedEnqueue,
    RecordedQuery,
    RecordedSubmit,
    StreamRecorder,
    TxRecorder,
)

__all__ = [
    "PostgresServer",
    "PostgresUnavailableError",
    "RecordedEnqueue",
    "RecordedQuery",
    "RecordedSubmit",
    "StreamRecorder",
    "TxRecorder",
    "describe",
    "new_context",
    "postgres_server",
]
