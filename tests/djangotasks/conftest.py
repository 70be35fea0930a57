"""The Django project of the tasks tests on the test's own database, and a Cyclone worker
for its tasks in a thread of this process (with an event loop of its own)."""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Callable, Iterator
from typing import Any

import asyncpg
import django
import pytest

import cyclone
from cyclone.testing.plugin import TEST_WORKER_OPTIONS, CycloneEnv

# Before any test sets Django up: the example app's tests use these settings too (a superset).
# Set up at collection, as the tests import the app's tasks and models.
os.environ["DJANGO_SETTINGS_MODULE"] = "tests.djangotasks.settings"
django.setup()


@pytest.fixture
def django_db(cyclone_env: CycloneEnv) -> Iterator[str]:
    """Django on the test's database, its tables migrated; the database's DSN."""
    from django.core.management import call_command
    from django.db import connections

    from tests.frameworks.sync_styles import configure_django

    configure_django(cyclone_env.dsn)
    call_command("migrate", "notes", verbosity=0)
    try:
        yield cyclone_env.dsn
    finally:
        connections.close_all()


WorkerStarter = Callable[..., None]


@pytest.fixture
def task_worker(django_db: str) -> Iterator[WorkerStarter]:
    """``start(only=None, **worker_options)``: a worker serving every task of the default
    backend (or those in ``only``), in a thread of its own until the test ends."""
    from cyclone.integrations.django.worker import backend_named, serve

    stops: list[tuple[threading.Thread, asyncio.AbstractEventLoop, asyncio.Event]] = []

    def start(only: Any = None, **options: Any) -> None:
        steps = serve(backend_named("default"))
        if only is not None:  # serve only these tasks' steps
            steps = [s for s in steps if s.name in {t.module_path for t in only}]
        ready = threading.Event()
        found: dict[str, Any] = {}

        async def work() -> None:
            stop = asyncio.Event()
            found["loop"], found["stop"] = asyncio.get_running_loop(), stop
            async with asyncpg.create_pool(django_db, min_size=1, max_size=8) as pool:
                client = cyclone.Client(pool)
                worker = cyclone.Worker(client, steps=steps, **{**TEST_WORKER_OPTIONS, **options})
                async with worker:
                    ready.set()
                    await stop.wait()

        thread = threading.Thread(target=asyncio.run, args=(work(),))
        thread.start()
        assert ready.wait(60), "the worker did not start"
        stops.append((thread, found["loop"], found["stop"]))

    yield start
    for thread, loop, stop in stops:
        loop.call_soon_threadsafe(stop.set)
        thread.join(60)
