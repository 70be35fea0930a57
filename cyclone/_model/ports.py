"""What the definitions need of the layers that serve them, as protocols.

A step's ``enqueue`` and a workflow's ``submit`` are given a client and hand the call to the
client's insert path (:class:`Inserter`, implemented by ``cyclone._enqueue.insert``); the
handles they give keep the client's runs service (``cyclone._model.handles.RunsClient``).
``cyclone.Client`` provides both, so nothing here names a layer above this one.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol, TypeAlias, runtime_checkable

import asyncpg

from cyclone._model.handles import RunsClient, RunServices

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession

    from cyclone._model.handles import ResultRun, Run


@runtime_checkable
class Tracked(Protocol):
    """A connection whose Cyclone writes record wakeups (``cyclone.track_wakeups``)."""

    @property
    def connection(self) -> asyncpg.Connection[Any] | asyncpg.pool.PoolConnectionProxy[Any]:
        """The connection it stands for."""
        ...

    def record(self, queue: str) -> None:
        """Record a wakeup of ``queue``."""
        ...

    def is_in_transaction(self) -> bool:
        """Whether its connection is inside a transaction."""
        ...


if TYPE_CHECKING:
    Tx: TypeAlias = (
        asyncpg.Connection[Any]
        | asyncpg.pool.PoolConnectionProxy[Any]
        | Tracked
        | AsyncSession
        | AsyncConnection
    )
else:  # SQLAlchemy is optional: a type checker sees its session types, the runtime need not
    Tx = asyncpg.Connection | asyncpg.pool.PoolConnectionProxy | Tracked
"""What a ``*_tx`` call accepts: an asyncpg connection in a transaction, a tracked one, or a
SQLAlchemy ``AsyncSession``/``AsyncConnection`` on asyncpg in a transaction."""


class Inserter(Protocol):
    """A client's insert path (``cyclone._enqueue.insert.Inserter``): checks a call, writes
    it through ``tx`` (None: Cyclone's own statement) and gives the handles."""

    async def enqueue(
        self, tx: object, kind: Any, inputs: Sequence[Any], options: Mapping[str, Any]
    ) -> list[ResultRun[Any]]:
        """Insert jobs of ``kind``; their handles in input order."""
        ...

    async def submit(
        self,
        tx: object,
        workflow: Any,
        key: str | None,
        input: Any,
        options: Mapping[str, Any],
        *,
        parent: tuple[uuid.UUID, str] | None = None,
    ) -> tuple[Run, bool]:
        """Submit a run of ``workflow`` (the one of ``key``; with ``parent``, the next child
        of that run's node); whether this call created it."""
        ...


class ClientServices(RunServices, Protocol):
    """The parts of a client that definitions and handles use: its runs service and its
    insert path."""

    @property
    def inserter(self) -> Inserter:
        """Where ``step.enqueue`` and ``workflow.submit`` hand their calls."""
        ...


class ClientPort(RunsClient, Protocol):
    """What a definition is given as ``client``: a :class:`cyclone.Client`."""

    @property
    def services(self) -> ClientServices:
        """The client's parts."""
        ...
