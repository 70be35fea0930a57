"""Django's tasks framework on Cyclone: a real Django project (tests/djangotasks), real
PostgreSQL, a real Cyclone worker. Run on the backport (Python 3.11) and on Django 6's
``django.tasks`` (``.ci/run`` builds a 3.12 venv for it)."""

from __future__ import annotations

import datetime as dt
import logging
import uuid
import zoneinfo
from typing import Any

import psycopg
import pytest
from django.db import connection, transaction
from django.utils import timezone

import cyclone
from cyclone.integrations.django.framework import (
    SOURCE,
    InvalidTaskError,
    TaskResultDoesNotExist,
    TaskResultMismatch,
    TaskResultStatus,
    task_backends,
)
from cyclone.integrations.django.kinds import TaskExited
from tests.djangotasks.conftest import WorkerStarter
from tests.djangotasks.notes import tasks
from tests.djangotasks.notes.models import Note, Ran


def wait(result: Any) -> None:
    """Until the task's job has ended (the sync client polls), then refresh ``result``."""
    backend = task_backends["default"]
    backend.client().get_run(uuid.UUID(result.id)).wait(timeout=60)
    result.refresh()


def runs(dsn: str) -> int:
    with psycopg.connect(dsn) as conn:
        return conn.execute("SELECT count(*) FROM public.cyclone_runs").fetchone()[0]  # type: ignore[index]


def test_the_backend_declares_what_it_supports(django_db: str) -> None:
    from django.core.management import call_command

    backend = task_backends["default"]
    assert type(backend).__module__ == "cyclone.integrations.django.backend"
    assert backend.alias == "default"
    assert backend.options == {}
    assert backend.supports_defer and backend.supports_async_task
    assert backend.supports_get_result and backend.supports_priority
    call_command("check")  # Django's checks and the backend's own: none fails


def test_a_rolled_back_view_leaves_neither_note_nor_task(django_db: str) -> None:
    with pytest.raises(tasks.NoteError):
        tasks.create_note("lost", fail=True)
    assert Note.objects.count() == 0
    assert runs(django_db) == 0


def test_a_committed_view_runs_its_task_once(django_db: str, task_worker: WorkerStarter) -> None:
    note_id = tasks.create_note("hello")
    [run_id] = _run_ids(django_db)
    result = tasks.mark_done.get_result(run_id)
    assert result.status == TaskResultStatus.READY
    assert result.args == [note_id] and result.kwargs == {}
    task_worker()
    wait(result)
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.return_value == "hello"
    assert Note.objects.get(id=note_id).runs == 1
    assert result.attempts == 1 and result.errors == []
    assert result.enqueued_at <= result.started_at <= result.finished_at
    assert result.last_attempted_at == result.started_at


def test_enqueue_inside_atomic_is_read_back_in_the_same_transaction(django_db: str) -> None:
    with transaction.atomic():
        result = tasks.calculate_meaning_of_life.enqueue()
        result.refresh()  # read in the open transaction, which holds the job
        assert result.status == TaskResultStatus.READY
        assert len(connection.run_on_commit) == 1  # the wakeup, after the commit
    assert task_backends["default"].get_result(result.id).task == tasks.calculate_meaning_of_life


def test_ids_that_are_not_django_tasks_have_no_result(django_db: str) -> None:
    plain = cyclone.register_kind("djangotasks.plain", int, None)
    run = task_backends["default"].client().enqueue(plain, 1)  # another producer's job
    for result_id in (str(run.id), str(uuid.uuid4()), "123"):
        with pytest.raises(TaskResultDoesNotExist):
            task_backends["default"].get_result(result_id)


def test_results_and_the_expectations_of_django_tests(
    django_db: str, task_worker: WorkerStarter
) -> None:
    meaning = tasks.calculate_meaning_of_life.enqueue()
    noop = tasks.double.enqueue(1, twice=False)
    context = tasks.who_am_i.enqueue("hi")
    assert meaning.status == TaskResultStatus.READY and not meaning.is_finished
    with pytest.raises(ValueError, match="Task has not finished yet"):
        meaning.return_value  # noqa: B018
    assert noop.args == [1] and noop.kwargs == {"twice": False}
    task_worker()
    for result in (meaning, noop, context):
        wait(result)
        assert result.status == TaskResultStatus.SUCCESSFUL and result.is_finished
    assert meaning.return_value == 42
    assert noop.return_value == 1
    assert context.return_value == {"id": context.id, "attempt": 1, "word": "hi"}
    again = task_backends["default"].get_result(meaning.id)
    assert again.task == tasks.calculate_meaning_of_life
    assert (again.id, again.status, again.return_value) == (meaning.id, meaning.status, 42)
    with pytest.raises(TaskResultDoesNotExist):
        task_backends["default"].get_result("123")
    with pytest.raises(TaskResultMismatch):
        tasks.double.get_result(meaning.id)


def test_failing_tasks_keep_their_errors(django_db: str, task_worker: WorkerStarter) -> None:
    own = tasks.fail.enqueue("out of paper")
    builtin = tasks.fail_builtin.enqueue()
    not_json = tasks.complex_return_value.enqueue()
    exits = tasks.exits.enqueue()
    task_worker()
    for result in (own, builtin, not_json, exits):
        wait(result)
        assert result.status == TaskResultStatus.FAILED and result.is_finished
        with pytest.raises(ValueError, match="Task failed"):
            result.return_value  # noqa: B018
        assert result.attempts == 1 and len(result.errors) == 1
        assert result.started_at is not None and result.finished_at is not None
    assert own.errors[0].exception_class is tasks.NoteError
    assert own.errors[0].traceback.endswith("NoteError: out of paper\n")
    assert builtin.errors[0].exception_class is ValueError
    assert builtin.errors[0].traceback.endswith("ValueError: This Task failed due to ValueError\n")
    assert not_json.errors[0].exception_class is TypeError
    assert "Unsupported type" in not_json.errors[0].traceback
    assert exits.errors[0].exception_class is TaskExited  # and the worker runs on
    assert exits.errors[0].traceback.endswith("TaskExited: the task raised SystemExit(3)\n")


def test_priority_queue_and_run_after(django_db: str, task_worker: WorkerStarter) -> None:
    later = timezone.now() + dt.timedelta(hours=1)
    deferred = tasks.record.using(run_after=later).enqueue("deferred")
    emails = tasks.record.using(queue_name="emails").enqueue("emails")
    for priority in (-100, 0, 100, 7):
        tasks.record.using(priority=priority).enqueue(f"p{priority}")
    with pytest.raises(InvalidTaskError, match="Queue 'unknown' is not valid"):
        tasks.record.using(queue_name="unknown").enqueue("nowhere")
    with pytest.raises(InvalidTaskError, match="priority"):
        tasks.record.using(priority=101).enqueue("too high")
    assert runs(django_db) == 6  # the refused calls wrote nothing
    result = tasks.record.get_result(deferred.id)
    assert result.task.run_after == later and result.status == TaskResultStatus.READY
    assert tasks.record.get_result(emails.id).task.queue_name == "emails"
    with psycopg.connect(django_db) as conn:
        stored = conn.execute(
            "SELECT queue, available_at FROM public.cyclone_tasks WHERE run_id = %s",
            (uuid.UUID(deferred.id),),
        ).fetchone()
    assert stored == ("default", later)
    task_worker(queues={"default": 1})  # one at a time: in priority order; no emails queue
    last = tasks.record.get_result(_run_ids(django_db, label_of="p-100")[0])
    wait(last)
    assert list(Ran.objects.order_by("id").values_list("label", flat=True)) == [
        "p100",
        "p7",
        "p0",
        "p-100",
    ]
    emails.refresh()
    deferred.refresh()
    assert emails.status == deferred.status == TaskResultStatus.READY


def test_aenqueue_and_aget_result(django_db: str, task_worker: WorkerStarter) -> None:
    from asgiref.sync import async_to_sync

    async def produce() -> Any:
        result = await tasks.double.aenqueue(21)
        return result, await task_backends["default"].aget_result(result.id)

    result, read = async_to_sync(produce)()
    assert read.id == result.id and read.status == TaskResultStatus.READY
    task_worker()
    wait(result)
    async_to_sync(result.arefresh)()
    assert result.return_value == 42


def test_override_settings_swaps_in_djangos_own_backends(django_db: str) -> None:
    from django.test import override_settings

    immediate = f"{SOURCE}.backends.immediate.ImmediateBackend"
    with override_settings(TASKS={"default": {"BACKEND": immediate}}):
        result = tasks.calculate_meaning_of_life.enqueue()
        assert result.status == TaskResultStatus.SUCCESSFUL and result.return_value == 42
    dummy = f"{SOURCE}.backends.dummy.DummyBackend"
    with override_settings(TASKS={"default": {"BACKEND": dummy}}):
        result = tasks.calculate_meaning_of_life.enqueue()
        assert result.status == TaskResultStatus.READY
    assert runs(django_db) == 0


def _run_ids(dsn: str, *, label_of: str | None = None) -> list[str]:
    """The ids of the jobs (of ``record`` called with ``label_of``)."""
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            "SELECT id FROM public.cyclone_runs"
            " WHERE %s::text IS NULL OR input->'args'->>0 = %s ORDER BY id",
            (label_of, label_of),
        ).fetchall()
    return [str(r[0]) for r in rows]


def test_a_django_testcase_rolls_its_tasks_back(django_db: str) -> None:
    import unittest

    from tests.djangotasks.notes.testcases import EnqueueInATestCase

    outcome = unittest.TestResult()
    unittest.defaultTestLoader.loadTestsFromTestCase(EnqueueInATestCase).run(outcome)
    assert outcome.wasSuccessful(), outcome.errors + outcome.failures
    assert outcome.testsRun == 1
    assert runs(django_db) == 0


def test_max_attempts_retries_a_failed_task(django_db: str, task_worker: WorkerStarter) -> None:
    from django.conf import settings
    from django.test import override_settings

    default = {**settings.TASKS["default"], "OPTIONS": {"MAX_ATTEMPTS": 2}}
    with override_settings(TASKS={"default": default}):
        result = tasks.flaky.enqueue()
        task_worker(backoff=lambda attempt: 0.0)
        wait(result)
    assert result.status == TaskResultStatus.SUCCESSFUL and result.return_value == 2
    assert result.attempts == 2 and len(result.worker_ids) == 2
    [error] = result.errors
    assert error.exception_class is tasks.NoteError
    assert result.started_at < result.last_attempted_at <= result.finished_at


def test_bad_options_are_refused_when_the_backend_is_made(django_db: str) -> None:
    from django.conf import settings
    from django.core.exceptions import ImproperlyConfigured
    from django.test import override_settings

    for options, message in [
        ({"MAX_ATTEMPT": 2}, "unknown OPTIONS MAX_ATTEMPT"),
        ({"MAX_ATTEMPTS": 0}, "MAX_ATTEMPTS must be an int from 1"),
        ({"SCHEMA": "Bad-Schema"}, "SCHEMA must be a lower-case identifier"),
    ]:
        default = {**settings.TASKS["default"], "OPTIONS": options}
        with (
            override_settings(TASKS={"default": default}),
            pytest.raises(ImproperlyConfigured, match=message),
        ):
            task_backends["default"]


def test_checks_name_a_database_cyclone_cannot_use(django_db: str) -> None:
    from django.conf import settings
    from django.test import override_settings

    for database, code in [("nowhere", "cyclone.E001"), ("lite", "cyclone.E002")]:
        default = {**settings.TASKS["default"], "OPTIONS": {"DATABASE": database}}
        with override_settings(TASKS={"default": default}):
            assert [m.id for m in task_backends["default"].check()] == [code]
    bad_queue = {**settings.TASKS["default"], "QUEUES": ["default", "two words"]}
    with override_settings(TASKS={"default": bad_queue}):
        assert [m.id for m in task_backends["default"].check()] == ["cyclone.E003"]


def test_the_class_path_of_an_error_and_the_workers_dsn(django_db: str) -> None:
    from cyclone.integrations.django.results import class_path
    from cyclone.integrations.django.worker import backend_named, dsn_of

    chained = "Traceback...\nKeyError: 'x'\n\nDuring handling...\nnotes.errors.Outer.Boom: no\n"
    assert class_path("Outer.Boom", chained) == "notes.errors.Outer.Boom"
    assert class_path("KeyError", chained) == "builtins.KeyError"
    url = dsn_of(backend_named("default"))
    with psycopg.connect(url) as conn:  # the database Django uses
        assert conn.info.dbname == connection.settings_dict["NAME"]


def test_a_running_task_reports_running(django_db: str, task_worker: WorkerStarter) -> None:
    tasks.STARTED.clear()
    tasks.RELEASE.clear()
    result = tasks.hold.enqueue()
    task_worker()
    try:
        assert tasks.STARTED.wait(60), "the task never started"
        result.refresh()
        assert result.status == TaskResultStatus.RUNNING and not result.is_finished
        assert result.attempts == 1 and result.finished_at is None
    finally:
        tasks.RELEASE.set()
    wait(result)
    assert result.status == TaskResultStatus.SUCCESSFUL and result.return_value == "released"


def test_the_signals_log_as_djangos_backends_do(
    django_db: str, task_worker: WorkerStarter, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger=SOURCE)
    ok = tasks.calculate_meaning_of_life.enqueue()
    failed = tasks.fail_builtin.enqueue()
    task_worker()
    wait(ok)
    wait(failed)
    lines = [r.getMessage() for r in caplog.records if r.name == SOURCE]
    for result, end in ((ok, "state=SUCCESSFUL"), (failed, "state=FAILED")):
        mine = [line for line in lines if result.id in line]
        assert len(mine) == 3, lines
        assert "enqueued" in mine[0] and "state=RUNNING" in mine[1] and end in mine[2]


def test_a_naive_run_after_is_in_the_current_time_zone(django_db: str) -> None:
    from django.test import override_settings

    with override_settings(USE_TZ=False, TIME_ZONE="Europe/Paris"):
        later = dt.datetime.now() + dt.timedelta(hours=1)
        result = tasks.record.using(run_after=later).enqueue("naive")
    with psycopg.connect(django_db) as conn:
        [available_at] = conn.execute(
            "SELECT available_at FROM public.cyclone_tasks WHERE run_id = %s",
            (uuid.UUID(result.id),),
        ).fetchone()  # type: ignore[misc]
    assert available_at == later.replace(tzinfo=zoneinfo.ZoneInfo("Europe/Paris"))


def test_two_workers_run_each_committed_task_once(
    django_db: str, task_worker: WorkerStarter
) -> None:
    notes = [tasks.create_note(f"note {i}") for i in range(30)]
    task_worker()
    task_worker()
    for run_id in _run_ids(django_db):
        wait(tasks.mark_done.get_result(run_id))
    assert sorted(Note.objects.values_list("id", "runs")) == [(n, 1) for n in notes]
