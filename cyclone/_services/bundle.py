"""What a client is made of, for Cyclone's own modules: the parts they are given explicitly.

Internal, not a stable API: applications use the client's public methods.
"""

from __future__ import annotations

from dataclasses import dataclass

from cyclone._services.database import Database
from cyclone._services.notifier import Notifier
from cyclone._services.observe import Observers
from cyclone._services.publisher import Publisher
from cyclone._services.runs import Runs


@dataclass(frozen=True, slots=True)
class Services:
    """One client's services (internal, not a stable API).

    ``database``: connections and Cyclone's own transactions; ``publisher``: wakeups;
    ``notifier``: this process's LISTEN connection, None with ``notify=False``; ``runs``:
    run reads and actions; ``observers``: metrics and traces.
    """

    database: Database
    publisher: Publisher
    notifier: Notifier | None
    runs: Runs
    observers: Observers
