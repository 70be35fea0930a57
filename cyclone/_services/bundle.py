"""What a client is made of, for Cyclone's own modules: the parts they are given explicitly.

A client builds one and is its only owner; it hands it to what it builds (a worker, the
handles of its runs), which take the parts they use from it and keep nothing else of the
client. Internal, not a stable API: applications use the client's public methods.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from cyclone._model.batches import HandlerBatchContext
from cyclone._model.context import HandlerContext
from cyclone._model.ports import Inserter
from cyclone._services.database import Database
from cyclone._services.notifier import Notifier
from cyclone._services.observe import Observers
from cyclone._services.publisher import Publisher
from cyclone._services.runs import Runs
from cyclone._services.streams import Streams


@dataclass(frozen=True, slots=True)
class Services:
    """One client's services (internal, not a stable API).

    ``database``: connections and Cyclone's own transactions; ``publisher``: wakeups;
    ``notifier``: this process's LISTEN connection, None with ``notify=False``; ``runs``:
    run reads and actions; ``streams``: progress and stream items; ``observers``: metrics
    and traces; ``inserter``: the insert path
    that ``step.enqueue`` and ``workflow.submit`` hand their calls to; ``new_context``: makes
    the context a worker's handler gets (its ``ctx.client`` is the client);
    ``new_batch_context``: the same for a batch handler.
    """

    database: Database
    publisher: Publisher
    notifier: Notifier | None
    runs: Runs
    streams: Streams
    observers: Observers
    inserter: Inserter
    new_context: Callable[..., HandlerContext[Any]]  # (attempt, **fields)
    new_batch_context: Callable[..., HandlerBatchContext[Any]]  # (kind, queue, group, attempts)
