"""A Django ``TaskResult`` read from a Cyclone job: its state, attempts and errors as the
run's statements report them, its call and return value from its input and output.

::

    Cyclone (the job's task row)       Django (TaskResultStatus)
    available, scheduled         ->    READY (enqueued, or waiting for its next attempt)
    running                      ->    RUNNING
    completed                    ->    SUCCESSFUL
    failed, cancelled            ->    FAILED
"""

from __future__ import annotations

import datetime as dt
import re
import uuid
from typing import Any

import msgspec
from django.db import transaction
from django.db.backends.base.base import BaseDatabaseWrapper

from cyclone._model import codec
from cyclone._storage import queries as db
from cyclone._storage.drivers import connect, run_sync
from cyclone._storage.loader import Queries
from cyclone.integrations.django.connection import psycopg_of
from cyclone.integrations.django.framework import (
    Task,
    TaskError,
    TaskResult,
    TaskResultDoesNotExist,
    TaskResultStatus,
)
from cyclone.integrations.django.kinds import TaskCall, TaskReturn, known_task, task_of

_STATUS = {
    "available": TaskResultStatus.READY,
    "scheduled": TaskResultStatus.READY,
    "pending": TaskResultStatus.READY,
    "running": TaskResultStatus.RUNNING,
    "completed": TaskResultStatus.SUCCESSFUL,
    "failed": TaskResultStatus.FAILED,
    "cancelled": TaskResultStatus.FAILED,
}
_RELEASED = "cyclone.RunFailedError"
"""The class an error without a traceback is reported as: a worker lost or a lease expired
under the attempt, a deadline passed, the run was cancelled."""


def read_result(
    wrapper: BaseDatabaseWrapper, queries: Queries, result_id: str
) -> TaskResult[Any, Any]:
    """The result of the task whose id is ``result_id``, read on Django's connection: in the
    open ``atomic()`` block if there is one (so a task enqueued in it is seen), else in a
    transaction of its own. ``TaskResultDoesNotExist`` if no committed (or own) job has
    that id, or if it is not a Django task's."""
    try:
        run_id = uuid.UUID(str(result_id))
    except ValueError:
        raise TaskResultDoesNotExist(f"{result_id!r} is not a Cyclone task id") from None
    with transaction.atomic(using=wrapper.alias, savepoint=False):
        conn = connect(psycopg_of(wrapper))
        row = run_sync(db.run_get(conn, queries, run_id))
        if row is None or not row["job"]:
            raise TaskResultDoesNotExist(result_id)
        (node,) = run_sync(db.run_nodes(conn, queries, run_id))
        payload = run_sync(db.run_payload(conn, queries, run_id))
    if payload is None:  # purged between the statements
        raise TaskResultDoesNotExist(result_id)
    try:
        call = codec.decode(payload["input"], TaskCall)
    except msgspec.DecodeError:  # another producer's job: its kind is not imported
        raise TaskResultDoesNotExist(f"run {result_id} is not a Django task's") from None
    task = known_task(row["name"])
    if task is None:
        raise TaskResultDoesNotExist(
            f"run {result_id} is of task {row['name']}, which this process cannot import"
        )
    returned = None
    if payload["output"] is not None:
        returned = codec.decode(payload["output"], TaskReturn)
    errors = codec.decode(node["errors"], list[dict[str, Any]])
    return _result(task_of(task, call), str(run_id), row, node, call, returned, errors)


def _result(
    task: Task[Any, Any],
    result_id: str,
    row: db.Record,
    node: db.Record,
    call: TaskCall,
    returned: TaskReturn | None,
    errors: list[dict[str, Any]],
) -> TaskResult[Any, Any]:
    starts = [_time(e.get("started_at")) for e in errors]
    workers = [str(e.get("worker") or "unknown") for e in errors]
    if returned is not None:
        starts.append(returned.started_at)
        workers.append(returned.worker_id)
    attempts = max(node["attempts"], len(workers))
    workers += ["unknown"] * (attempts - len(workers))  # the attempt running now
    known = [s for s in starts if s is not None]
    result: TaskResult[Any, Any] = TaskResult(
        task=task,
        id=result_id,
        status=_STATUS.get(node["state"], TaskResultStatus.READY),
        enqueued_at=row["created_at"],
        started_at=known[0] if known else None,
        finished_at=row["finished_at"],
        last_attempted_at=known[-1] if known else None,
        args=call.args,
        kwargs=call.kwargs,
        backend=call.backend,
        errors=[_error(e) for e in errors],
        worker_ids=workers,
    )
    if returned is not None:
        object.__setattr__(result, "_return_value", returned.value)
    return result


def _time(text: object) -> dt.datetime | None:
    return dt.datetime.fromisoformat(text) if isinstance(text, str) else None


def _error(error: dict[str, Any]) -> TaskError:
    name = str(error.get("type") or "")
    trace = error.get("traceback")
    if not name or not isinstance(trace, str):
        return TaskError(
            exception_class_path=_RELEASED, traceback=f"{name}: {error.get('message', '')}\n"
        )
    return TaskError(exception_class_path=class_path(name, trace), traceback=trace)


def class_path(name: str, trace: str) -> str:
    """The import path of exception class ``name`` (a qualified name) as a traceback shows
    the last exception: Python writes ``module.Name: message``, or ``Name: message`` for a
    builtin."""
    header = re.compile(rf"^(?:([\w.]+)\.)?{re.escape(name)}(?::|$)", re.MULTILINE)
    found = header.findall(trace)
    module = (found[-1] if found else "") or "builtins"
    return f"{module}.{name}"
