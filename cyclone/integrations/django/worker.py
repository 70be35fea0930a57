"""What ``manage.py cyclone_worker`` serves: every task defined for a ``CycloneBackend``,
found by importing each installed app's ``tasks`` module and the backend's ``MODULES``.

A task enqueued by code the worker does not import is not lost: no worker claims a kind it
does not serve, so its job waits in its queue, and the unserved-work warning of the workers
of that queue names its kind (the task's module path) until a worker that knows it starts.
"""

from __future__ import annotations

import importlib
from typing import Any
from urllib.parse import quote, urlencode

from django.db import connections
from django.utils.module_loading import autodiscover_modules

from cyclone._model.steps import Step
from cyclone.integrations.django.backend import CycloneBackend
from cyclone.integrations.django.framework import task_backends
from cyclone.integrations.django.kinds import known_tasks, step_of

SERVED: list[Step[Any, Any]] = []
"""The steps of the worker being started (``cyclone worker``'s target), set by ``serve``."""


def backend_named(alias: str) -> CycloneBackend:
    """The ``CycloneBackend`` of ``TASKS[alias]``; ``TypeError`` for another backend."""
    backend = task_backends[alias]
    if not isinstance(backend, CycloneBackend):
        raise TypeError(
            f"TASKS[{alias!r}] is {type(backend).__module__}.{type(backend).__name__}, "
            "not cyclone.integrations.django.CycloneBackend"
        )
    return backend


def serve(backend: CycloneBackend) -> list[Step[Any, Any]]:
    """Import the apps' ``tasks`` modules and the backend's ``MODULES``; the steps of the
    tasks defined for ``backend``, kept in :data:`SERVED`."""
    autodiscover_modules("tasks")
    for module in backend.modules:
        importlib.import_module(module)
    SERVED[:] = [
        step_of(task, max_attempts=backend.max_attempts)
        for task in known_tasks()
        if task.backend == backend.alias
    ]
    return SERVED


def dsn_of(backend: CycloneBackend) -> str:
    """A libpq URL of the backend's database, from its Django settings, for asyncpg."""
    settings = connections[backend.database].settings_dict
    host, port = settings.get("HOST") or "", str(settings.get("PORT") or "")
    auth = quote(settings.get("USER") or "", safe="")
    if settings.get("PASSWORD"):
        auth += ":" + quote(settings["PASSWORD"], safe="")
    query = {k: v for k, v in (settings.get("OPTIONS") or {}).items() if k == "sslmode"}
    netloc = f"{auth}@" if auth else ""
    if host.startswith("/"):  # a Unix socket's directory
        query["host"] = host
    else:
        netloc += host + (f":{port}" if port else "")
    if host.startswith("/") and port:
        query["port"] = port
    name = quote(settings.get("NAME") or "", safe="")
    return f"postgresql://{netloc}/{name}" + (f"?{urlencode(query)}" if query else "")
