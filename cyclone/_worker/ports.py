"""What a worker needs of the client it is given, as a protocol: ``cyclone.Worker(client)``
takes a ``cyclone.Client``, and the worker's parts name only this."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from cyclone._model.context import HandlerAttempt, HandlerContext
    from cyclone._model.ports import Inserter
    from cyclone._services.bundle import Services
    from cyclone._services.observe import Observers
    from cyclone._services.runs import Retention
    from cyclone._storage.loader import Queries


class WorkerClient(Protocol):
    """The client of a worker (``cyclone.Client``): its services and statements, its limits,
    its insert path (schedules submit through it), and the contexts its handlers get."""

    @property
    def _services(self) -> Services: ...
    @property
    def _queries(self) -> Queries: ...
    @property
    def _inserter(self) -> Inserter: ...
    @property
    def payload_limit(self) -> int: ...
    @property
    def output_limit(self) -> int: ...
    @property
    def observers(self) -> Observers: ...
    @property
    def retention(self) -> Retention | None: ...

    def _new_context(self, attempt: HandlerAttempt, **fields: Any) -> HandlerContext[Any]: ...
