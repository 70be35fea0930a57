"""Hooks for metrics and tracing: what the client and its workers report, and to whom.

An :class:`Observer` gets told about enqueues, claims, outcomes and reclaims (what this
process did), and may wrap enqueues and handler runs in spans. Database-wide figures (queue
depth, unserved work) are not an observer's: ``cyclone.prometheus.QueueCollector`` reads
them at scrape time. ``cyclone.prometheus`` and ``cyclone.otel`` are the two
that ship; ``client.observe(observer)`` installs one. A failing observer is logged and never
breaks the work it observes.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Mapping
from typing import Any

logger = logging.getLogger("cyclone")

Attributes = Mapping[str, Any]


class Observer:
    """Base class of metrics and tracing hooks; every hook does nothing unless overridden.

    ``outcome`` in :meth:`finished` is one of ``completed``, ``failed`` (last attempt),
    ``retried``, ``snoozed``, ``cancelled`` or ``rejected`` (a completion that lost its task).
    """

    def enqueued(self, kind: str, queue: str, count: int) -> None:
        """``count`` runs of ``kind`` were written (in a transaction that may yet roll back)."""

    def claimed(self, queue: str, count: int, seconds: float) -> None:
        """A claim statement took ``seconds`` and claimed ``count`` tasks."""

    def finished(self, kind: str, queue: str, outcome: str, seconds: float) -> None:
        """A handler ran for ``seconds`` and its attempt ended with ``outcome``."""

    def reclaimed(self, count: int) -> None:
        """Maintenance made ``count`` tasks with expired leases available again."""

    def released(self, reason: str, count: int) -> None:
        """This worker released ``count`` running tasks of other workers for ``reason``:
        ``worker_lost`` (its lock stayed free past its grace, or its process is gone) or
        ``lease_expired``."""

    def rescued_alive(self, worker: str) -> None:
        """Peers released the tasks of ``worker``, a worker of this process, for lost while
        it lived (it was cut off from the database past its grace)."""

    def schedule_fired(self, schedule: str, lag: float) -> None:
        """A worker made the run of one of ``schedule``'s slots, ``lag`` seconds after the
        slot time (by the database's clock). Triggers are not slots and are not reported."""

    def trace_context(self) -> dict[str, str] | None:
        """A carrier for the current trace, stored with runs enqueued now."""
        return None

    @contextlib.contextmanager
    def enqueue_span(self, name: str, attributes: Attributes) -> Iterator[None]:
        """Wrap an enqueue or submit."""
        yield

    @contextlib.contextmanager
    def handler_span(
        self, name: str, carrier: Mapping[str, str] | None, attributes: Attributes
    ) -> Iterator[None]:
        """Wrap a handler run; ``carrier`` is the trace stored when the run was enqueued."""
        yield


class Observers(Observer):
    """The client's observers, called in turn; one that raises is logged and skipped."""

    def __init__(self) -> None:
        self.members: list[Observer] = []

    def _each(self, hook: str, *args: Any) -> None:
        for member in self.members:
            try:
                getattr(member, hook)(*args)
            except Exception:  # an observer must never break the work it observes
                logger.exception("observer %r failed in %s; skipped", member, hook)

    def enqueued(self, kind: str, queue: str, count: int) -> None:
        self._each("enqueued", kind, queue, count)

    def claimed(self, queue: str, count: int, seconds: float) -> None:
        self._each("claimed", queue, count, seconds)

    def finished(self, kind: str, queue: str, outcome: str, seconds: float) -> None:
        self._each("finished", kind, queue, outcome, seconds)

    def reclaimed(self, count: int) -> None:
        self._each("reclaimed", count)

    def released(self, reason: str, count: int) -> None:
        self._each("released", reason, count)

    def rescued_alive(self, worker: str) -> None:
        self._each("rescued_alive", worker)

    def schedule_fired(self, schedule: str, lag: float) -> None:
        self._each("schedule_fired", schedule, lag)

    def trace_context(self) -> dict[str, str] | None:
        carrier: dict[str, str] = {}
        for member in self.members:
            try:
                carrier.update(member.trace_context() or {})
            except Exception:  # an observer must never break the work it observes
                logger.exception("observer %r failed in trace_context; skipped", member)
        return carrier or None

    def enqueue_span(  # type: ignore[override]
        self, name: str, attributes: Attributes
    ) -> contextlib.AbstractContextManager[None]:
        if not self.members:  # the common case costs nothing on the hot path
            return _NOTHING
        return self._nest("enqueue_span", name, attributes)

    def handler_span(  # type: ignore[override]
        self, name: str, carrier: Mapping[str, str] | None, attributes: Attributes
    ) -> contextlib.AbstractContextManager[None]:
        if not self.members:
            return _NOTHING
        return self._nest("handler_span", name, carrier, attributes)

    @contextlib.contextmanager
    def _nest(self, hook: str, *args: Any) -> Iterator[None]:
        with contextlib.ExitStack() as stack:
            for member in self.members:
                try:
                    stack.enter_context(getattr(member, hook)(*args))
                except Exception:  # skip the span it could not open; the work goes on
                    logger.exception("observer %r failed in %s; skipped", member, hook)
            yield


_NOTHING: contextlib.AbstractContextManager[None] = contextlib.nullcontext()
