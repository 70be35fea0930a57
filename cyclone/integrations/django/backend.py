"""``CycloneBackend``: Django's tasks framework on Cyclone (docs/integrations.md).

``task.enqueue()`` writes a Cyclone job through Django's connection: inside ``atomic()`` in
its transaction (the job commits or rolls back with the block's ORM writes, and workers are
woken by ``transaction.on_commit``), outside it in a transaction of its own, committed when
``enqueue`` returns. ``manage.py cyclone_worker`` runs the tasks.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from typing import Any

from django.core import checks
from django.core.exceptions import ImproperlyConfigured
from django.db import connections
from django.utils import timezone

import cyclone.sync
from cyclone._model.errors import CycloneError
from cyclone._model.keys import validate_name
from cyclone._model.options import validate_int, validate_queue
from cyclone._model.steps import DEFAULT_QUEUE
from cyclone._storage.loader import validate_identifier
from cyclone.integrations.django.framework import (
    BaseTaskBackend,
    Task,
    TaskResult,
    TaskResultStatus,
    json_value,
    task_enqueued,
)
from cyclone.integrations.django.kinds import TaskCall, remember, step_of
from cyclone.integrations.django.results import read_result

OPTIONS = {
    "DATABASE": "the Django database alias Cyclone's tables are in (default 'default')",
    "SCHEMA": "Cyclone's schema in that database (default 'public')",
    "MAX_ATTEMPTS": "attempts of a task before it fails (default 1: Django retries nothing)",
    "MODULES": "modules the worker imports for their tasks, beside each app's tasks module",
}
"""The ``OPTIONS`` a ``CycloneBackend`` takes, with what each means."""


class CycloneBackend(BaseTaskBackend):
    """A Django task backend that keeps tasks as Cyclone jobs in PostgreSQL.

    ``TASKS = {"default": {"BACKEND": "cyclone.integrations.django.CycloneBackend",
    "QUEUES": [...], "OPTIONS": {...}}}``; the options are :data:`OPTIONS`. Tasks may be
    deferred (``run_after``), async, prioritised, and their results are read from any
    process.
    """

    supports_defer = True
    supports_async_task = True
    supports_get_result = True
    supports_priority = True

    def __init__(self, alias: str, params: dict[str, Any]) -> None:
        super().__init__(alias, params)
        unknown = sorted(set(self.options) - set(OPTIONS))
        if unknown:
            raise ImproperlyConfigured(
                f"task backend {alias!r}: unknown OPTIONS {', '.join(unknown)}; "
                f"it takes {', '.join(OPTIONS)}"
            )
        try:
            self.database: str = validate_name(
                self.options.get("DATABASE", "default"), what="OPTIONS DATABASE"
            )
            self.schema: str = validate_identifier(
                self.options.get("SCHEMA", "public"), what="OPTIONS SCHEMA"
            )
            self.max_attempts: int = validate_int(
                self.options.get("MAX_ATTEMPTS", 1), what="OPTIONS MAX_ATTEMPTS", low=1
            )
        except (CycloneError, ValueError) as exc:
            raise ImproperlyConfigured(f"task backend {alias!r}: {exc}") from None
        self.modules: list[str] = list(self.options.get("MODULES", []))
        self._local = threading.local()

    def validate_task(self, task: Task[Any, Any]) -> None:
        """Django's checks, then remember the task for the worker of this process."""
        super().validate_task(task)
        remember(task)

    def client(self) -> cyclone.sync.Client:
        """The synchronous client on this thread's connection to the backend's database
        (Django's connections are per thread)."""
        wrapper = connections[self.database]
        made = getattr(self._local, "client", None)
        if made is None or made.source is not wrapper:
            made = cyclone.sync.Client(wrapper, schema=self.schema)
            self._local.client = made
        return made

    def enqueue(self, task: Task[Any, Any], args: Any, kwargs: Any) -> TaskResult[Any, Any]:
        """Write ``task``'s job: in the open ``atomic()`` block of the backend's database, or
        else in a transaction of its own, committed before this returns."""
        self.validate_task(task)
        call = TaskCall(
            args=json_value(list(args)),
            kwargs=json_value(dict(kwargs)),
            backend=self.alias,
            queue_name=task.queue_name,
            priority=task.priority,
            run_after=task.run_after,
        )
        step = step_of(task, max_attempts=self.max_attempts)
        options: dict[str, Any] = {
            "queue": task.queue_name,
            "priority": task.priority,
            "max_attempts": self.max_attempts,
        }
        if task.run_after is not None:  # naive (USE_TZ = False): in the current time zone
            run_after = task.run_after
            options["process_at"] = (
                timezone.make_aware(run_after) if timezone.is_naive(run_after) else run_after
            )
        client = self.client()
        wrapper = connections[self.database]
        if wrapper.in_atomic_block:
            run = client.enqueue_tx(wrapper, step, call, **options)
        else:
            run = client.enqueue(step, call, **options)
        result: TaskResult[Any, Any] = TaskResult(
            task=task,
            id=str(run.id),
            status=TaskResultStatus.READY,
            enqueued_at=None,
            started_at=None,
            finished_at=None,
            last_attempted_at=None,
            args=call.args,
            kwargs=call.kwargs,
            backend=self.alias,
            errors=[],
            worker_ids=[],
        )
        task_enqueued.send(type(self), task_result=result)
        return result

    def get_result(self, result_id: str) -> TaskResult[Any, Any]:
        """The task's result as stored now; ``TaskResultDoesNotExist`` for an unknown id."""
        client = self.client()
        return read_result(connections[self.database], client.services.database.queries, result_id)

    def check(self, **kwargs: Any) -> list[checks.CheckMessage]:
        """The database must be PostgreSQL, the queues Cyclone queue names."""
        return list(self._problems())

    def _problems(self) -> Iterable[checks.CheckMessage]:
        wrapper = connections[self.database] if self.database in connections.settings else None
        if wrapper is None:
            yield checks.Error(
                f"task backend {self.alias!r}: OPTIONS DATABASE {self.database!r} is not in "
                "DATABASES",
                id="cyclone.E001",
            )
        elif wrapper.vendor != "postgresql":
            yield checks.Error(
                f"task backend {self.alias!r}: database {self.database!r} is "
                f"{wrapper.vendor}; Cyclone needs PostgreSQL",
                id="cyclone.E002",
            )
        for queue in sorted(self.queues or {DEFAULT_QUEUE}):
            try:
                validate_queue(queue)
            except CycloneError as exc:
                yield checks.Error(f"task backend {self.alias!r}: {exc}", id="cyclone.E003")
