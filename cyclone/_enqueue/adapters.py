"""Adapters: how the core takes other libraries' transactions without importing them.

The caller's transaction may be an object of a library Cyclone does not depend on (a
SQLAlchemy session, Django's connection). Each such library has an :class:`Adapter`, in
``cyclone.integrations``, that turns its objects into what the core works with: a write
target, a tracked block, a tracker of wakeups, a connection for Cyclone's own statements.

An adapter is found by the top-level package of the object's type (or of a base class:
a subclass of ``AsyncSession`` counts), through the ``cyclone.adapters`` entry points
(``sqlalchemy = "cyclone.integrations.sqlalchemy:ADAPTER"``). An entry point is loaded the
first time an object of its package is met, so that a library that is never used is never
imported; :func:`register` adds one directly (tests, a library of one's own).
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import threading
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from cyclone._enqueue.targets import CallerTransaction, InsertSettings
    from cyclone._model.wakeups import Wakeups

GROUP = "cyclone.adapters"
"""The entry-point group: each name is a top-level package, each value an :class:`Adapter`."""

Publish = Callable[[Iterable[str]], None]
"""Sends NOTIFY payloads soon, without waiting (the client's publisher)."""
SyncParts = tuple[Callable[[], Any], Callable[[str], None] | None]
"""A function giving the psycopg connection of the caller's open transaction, and the
recorder of its wakeups (None: not tracked, the workers' poll finds the work)."""


class Adapter:
    """What an integration lends the core for the objects of one library.

    Every hook returns None (or False) for an object it does not handle, and the core then
    says what it takes.
    """

    def async_target(
        self, settings: InsertSettings, publish: Publish, tx: object
    ) -> CallerTransaction | None:
        """The write target of ``tx`` as the caller's transaction, on asyncpg."""
        return None

    def async_transaction(
        self, publish: Publish, tx: object
    ) -> contextlib.AbstractAsyncContextManager[Any] | None:
        """``client.transaction(tx)``: a block whose wakeups ``publish`` sends after commit."""
        return None

    def track(self, tx: object, wakeups: Wakeups) -> bool:
        """``track_wakeups(tx)``: make ``tx`` record its committed wakeups into ``wakeups``."""
        return False

    def sync_parts(self, tx: object, publish: Publish) -> SyncParts | None:
        """The caller's transaction ``tx`` on psycopg (``cyclone.sync``)."""
        return None

    def sync_transaction(
        self, tx: object, publish: Publish
    ) -> contextlib.AbstractContextManager[Any] | None:
        """``cyclone.sync.Client.transaction(tx)``."""
        return None

    def own_connection(self, source: object) -> Callable[[], Any] | None:
        """For ``cyclone.sync.Client(source)``: a function giving a psycopg connection for
        Cyclone's own statements, each committed on its own."""
        return None


_adapters: dict[str, Adapter] = {}
_looked_up: set[str] = set()
# The synchronous client runs in many threads: the first objects of a package can be met in
# two at once, and the second must wait for the first's load, not find no adapter meanwhile.
_loading = threading.Lock()


def register(package: str, adapter: Adapter) -> None:
    """Use ``adapter`` for the objects of the top-level package ``package``."""
    with _loading:
        _adapters[package] = adapter
        _looked_up.add(package)


def adapter_for(obj: object) -> Adapter | None:
    """The adapter for ``obj``'s library, loaded on first use; None if there is none."""
    for cls in type(obj).__mro__:
        package = cls.__module__.partition(".")[0]
        if package not in _looked_up:
            _load(package)
        if package in _adapters:
            return _adapters[package]
    return None


def _load(package: str) -> None:
    """Load the entry points of ``package``, once; marked as looked up only when loaded."""
    with _loading:
        if package in _looked_up:  # another thread loaded it while this one waited
            return
        for entry in importlib.metadata.entry_points(group=GROUP, name=package):
            _adapters[package] = entry.load()
        _looked_up.add(package)
