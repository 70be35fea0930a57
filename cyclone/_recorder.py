"""A completion transaction that records instead of writing, for unit tests of handlers."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any

from cyclone._options import Options


@dataclass(frozen=True, slots=True)
class RecordedEnqueue:
    """A job a handler enqueued in its completion transaction."""

    kind: str
    input: Any
    options: Options
    run_id: uuid.UUID


@dataclass(frozen=True, slots=True)
class RecordedSubmit:
    """A workflow run a handler submitted in its completion transaction."""

    workflow: str
    input: Any
    options: Options
    run_id: uuid.UUID
    key: str | None = None


@dataclass(frozen=True, slots=True)
class RecordedQuery:
    """A statement a handler ran on its completion transaction (recorded, not run)."""

    method: str
    query: str
    args: tuple[Any, ...]


@dataclass
class TxRecorder:
    """Stands in for the completion transaction in ``cyclone.testing.new_context``.

    ``enqueue_completion`` and ``submit_completion`` are checked as for real (input types,
    payload limits, options, keys) and recorded in ``enqueued`` and ``submitted``; statements
    a handler runs on ``ctx.completion_tx()`` are recorded in ``queries``. Nothing reaches a
    database. ``fetch`` returns an empty list, ``fetchrow`` and ``fetchval`` return None.
    """

    enqueued: list[RecordedEnqueue] = field(default_factory=list)
    submitted: list[RecordedSubmit] = field(default_factory=list)
    queries: list[RecordedQuery] = field(default_factory=list)

    async def open(self) -> TxRecorder:
        """The recorder is its own connection."""
        return self

    def is_in_transaction(self) -> bool:
        """Always in a transaction, as a completion transaction is."""
        return True

    async def execute(self, query: str, *args: Any, **_: Any) -> str:
        """Record a statement; returns an empty status."""
        self.queries.append(RecordedQuery("execute", query, args))
        return ""

    async def fetch(self, query: str, *args: Any, **_: Any) -> list[Any]:
        """Record a query; returns no rows."""
        self.queries.append(RecordedQuery("fetch", query, args))
        return []

    async def fetchrow(self, query: str, *args: Any, **_: Any) -> None:
        """Record a query; returns no row."""
        self.queries.append(RecordedQuery("fetchrow", query, args))

    async def fetchval(self, query: str, *args: Any, **_: Any) -> None:
        """Record a query; returns no value."""
        self.queries.append(RecordedQuery("fetchval", query, args))
