"""What a worker needs of the client it is given, as a protocol: ``cyclone.Worker(client)``
takes a ``cyclone.Client``; the worker reads its parts and settings here, once, and hands
each of its own parts what that part uses (it keeps nothing else of the client)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from typing_extensions import TypeVar

from cyclone._enqueue.insert import Parts
from cyclone._enqueue.targets import InsertSettings
from cyclone._model.ports import ClientPort

if TYPE_CHECKING:
    from cyclone._model.keyring import Keyring
    from cyclone._model.retention import Retention
    from cyclone._services.bundle import Services


class WorkerClient(ClientPort, Protocol):
    """The client of a worker (``cyclone.Client``): its parts, its limits, its retention."""

    @property
    def services(self) -> Services:
        """The client's parts."""
        ...

    @property
    def payload_limit(self) -> int:
        """The largest encoded input, in bytes (a child run's, a scheduled run's)."""
        ...

    @property
    def output_limit(self) -> int:
        """The largest encoded output, in bytes."""
        ...

    @property
    def cipher(self) -> Keyring | None:
        """The keyring that seals payloads, or None."""
        ...

    @property
    def retention(self) -> Retention | None:
        """Which terminal runs the worker's maintenance deletes."""
        ...


ClientT = TypeVar("ClientT", bound=WorkerClient, default=WorkerClient)
"""The client a worker was given: ``cyclone.Worker(client).client`` is typed as that client."""


def insert_parts(client: WorkerClient) -> Parts:
    """The client's insert path's parts, for the runs a worker writes itself (scheduled runs,
    child runs): its statements, limit, observers, database and publisher; the handles it
    gives are the client's."""
    services = client.services
    settings = InsertSettings(
        services.database.queries,
        client.payload_limit,
        services.observers,
        client.cipher,
        layout=services.database.layout,
    )
    return Parts(settings, services.database, services.publisher, owner=client)
