"""``manage.py cyclone_worker`` as a process of its own, and what happens to a task that no
worker serves."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import uuid

import pytest
from django.conf import settings

from cyclone.integrations.django.framework import SOURCE, TaskResultStatus, task_backends
from tests.conftest import ROOT
from tests.djangotasks.conftest import WorkerStarter
from tests.djangotasks.notes import tasks
from tests.djangotasks.notes.models import Note
from tests.djangotasks.test_backend import wait


def test_the_management_command_runs_the_tasks(django_db: str) -> None:
    note_id = tasks.create_note("from a view")
    deferred = tasks.double.using(queue_name="emails").enqueue(4)
    env = {**os.environ, "CYCLONE_DATABASE_URL": django_db, "PYTHONPATH": str(ROOT)}
    command = [sys.executable, "-m", "django", "cyclone_worker", "--poll-interval", "0.1"]
    command += ["--settings", "tests.djangotasks.settings"]
    worker = subprocess.Popen(
        command, cwd=ROOT, env=env, stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL
    )
    try:
        wait(deferred)  # the emails queue too: the command serves the backend's QUEUES
        assert deferred.status == TaskResultStatus.SUCCESSFUL and deferred.return_value == 8
        note = Note.objects.get(id=note_id)
        assert note.runs == 1
    finally:
        worker.send_signal(signal.SIGTERM)
        _, err = worker.communicate(timeout=60)
    assert worker.returncode == 0, err
    assert "tests.djangotasks.notes.tasks.mark_done" in err  # the tasks it serves, listed


def test_the_command_refuses_a_backend_that_is_not_cyclone(django_db: str) -> None:
    from django.core.management import CommandError, call_command
    from django.test import override_settings

    immediate = {"BACKEND": f"{SOURCE}.backends.immediate.ImmediateBackend"}
    with override_settings(TASKS={**settings.TASKS, "other": immediate}):
        with pytest.raises(
            CommandError, match=re.escape("not cyclone.integrations.django.CycloneBackend")
        ):
            call_command("cyclone_worker", backend="other")
        with pytest.raises(CommandError, match="'missing' doesn't exist"):
            call_command("cyclone_worker", backend="missing")


def test_a_task_no_worker_serves_waits_and_is_named(
    django_db: str, task_worker: WorkerStarter
) -> None:
    unserved = tasks.record.enqueue("waits")
    served = tasks.calculate_meaning_of_life.enqueue()
    task_worker(only=[tasks.calculate_meaning_of_life])
    wait(served)
    run = task_backends["default"].client().get_run(uuid.UUID(unserved.id))
    with pytest.raises(TimeoutError, match=re.escape(tasks.record.module_path)):
        run.wait(timeout=0.5)
    unserved.refresh()
    assert unserved.status == TaskResultStatus.READY
    task_worker(only=[tasks.record])  # a worker that knows it runs it
    wait(unserved)
    assert unserved.status == TaskResultStatus.SUCCESSFUL
