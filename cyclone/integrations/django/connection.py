"""Django's database connection as the caller's transaction (``cyclone.sync``).

Inside ``transaction.atomic()`` Cyclone writes through the psycopg 3 connection Django holds
and registers each wakeup with ``transaction.on_commit``: Django runs it after the outermost
commit and drops it with a savepoint that rolls back, which is the wakeup rule.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import psycopg
from django.db import transaction
from django.db.backends.base.base import BaseDatabaseWrapper
from django.utils.connection import ConnectionProxy

from cyclone._enqueue.adapters import Adapter, Publish, SyncParts
from cyclone._model.errors import InvalidInputError, InvalidStateError, NotInTransactionError
from cyclone._services.notifier import queue_payload

NOT_IN_ATOMIC = "a *_tx call on Django's connection needs a transaction.atomic() block around it"


def wrapper_of(source: object) -> BaseDatabaseWrapper | None:
    """Django's connection wrapper behind ``source`` (``django.db.connection`` or
    ``connections[alias]``), or None if it is not one."""
    if isinstance(source, ConnectionProxy):
        source = source._connections[source._alias]
    return source if isinstance(source, BaseDatabaseWrapper) else None


def psycopg_of(wrapper: BaseDatabaseWrapper) -> psycopg.Connection[Any]:
    """The psycopg 3 connection of a PostgreSQL database wrapper, connected if need be."""
    if wrapper.vendor != "postgresql":
        raise InvalidInputError(
            f"Django database {wrapper.alias!r} is {wrapper.vendor}; Cyclone needs PostgreSQL"
        )
    wrapper.ensure_connection()
    raw = wrapper.connection
    if not isinstance(raw, psycopg.Connection):
        raise InvalidInputError(
            f"Django database {wrapper.alias!r} runs on psycopg2; Cyclone needs psycopg 3: "
            "pip install 'cyclone-pg[django]' (Django picks psycopg 3 when it is installed)"
        )
    return raw


def caller_parts(
    wrapper: BaseDatabaseWrapper, publish: Callable[[list[str]], None]
) -> tuple[Callable[[], psycopg.Connection[Any]], Callable[[str], None]]:
    """A function giving the psycopg connection of the open ``atomic()`` block, and the
    wakeup recorder (``on_commit``)."""

    def conn() -> psycopg.Connection[Any]:
        if not wrapper.in_atomic_block:
            raise NotInTransactionError(NOT_IN_ATOMIC)
        return psycopg_of(wrapper)

    def record(queue: str) -> None:
        # One wakeup per queue and commit: skip a queue whose wakeup is already registered at
        # this savepoint level or an enclosing one (Django drops the entries of a savepoint
        # that rolls back, and clears them all at the commit).
        alive = set(wrapper.savepoint_ids)
        for sids, func, *_ in wrapper.run_on_commit:
            if isinstance(func, _Wake) and func.queue == queue and set(sids) <= alive:
                return
        transaction.on_commit(_Wake(queue, publish), using=wrapper.alias)

    return conn, record


def own_connection(wrapper: BaseDatabaseWrapper) -> psycopg.Connection[Any]:
    """Django's connection for Cyclone's own statements: only outside ``atomic()``, where
    Django runs in autocommit mode."""
    if wrapper.in_atomic_block:
        raise InvalidStateError(
            "this call would commit with the open transaction.atomic() block: "
            "use its *_tx form (enqueue_tx(connection, ...)) inside atomic()"
        )
    return psycopg_of(wrapper)


class _Wake:
    """An ``on_commit`` callback that publishes one queue's wakeup."""

    def __init__(self, queue: str, publish: Callable[[list[str]], None]) -> None:
        self.queue = queue
        self.publish = publish

    def __call__(self) -> None:
        self.publish([queue_payload(self.queue)])


class _Django(Adapter):
    """Django's connection (``django.db.connection``, ``connections[alias]``) on psycopg 3."""

    def sync_parts(self, tx: object, publish: Publish) -> SyncParts | None:
        wrapper = wrapper_of(tx)
        return None if wrapper is None else caller_parts(wrapper, publish)

    def own_connection(self, source: object) -> Callable[[], Any] | None:
        wrapper = wrapper_of(source)
        return None if wrapper is None else (lambda: own_connection(wrapper))


ADAPTER = _Django()
"""The ``cyclone.adapters`` entry point for ``django``."""
