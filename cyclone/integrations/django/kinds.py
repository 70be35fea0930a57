"""Each Django task as a Cyclone step: its kind is the task's module path, its input the
call (``args``, ``kwargs`` and the options it was enqueued with), its output the return
value with when and where the attempt that returned it ran.

A plain ``def`` task runs as a plain ``def`` handler (in a worker thread, docs/worker.md);
an ``async def`` task as an ``async def`` one. Either sends Django's ``task_started`` and
``task_finished`` signals, and gets a ``TaskContext`` when it ``takes_context``.
"""

from __future__ import annotations

import datetime as dt
import inspect
import os
import socket
import threading
from collections.abc import Callable
from typing import Any

import msgspec
from django.db import close_old_connections
from django.utils import timezone
from django.utils.module_loading import import_string

from cyclone._client import Context
from cyclone._model.steps import Step
from cyclone.integrations.django.framework import (
    Task,
    TaskContext,
    TaskResult,
    TaskResultStatus,
    json_value,
    task_finished,
    task_started,
)

WORKER_ID = f"{socket.gethostname()}:{os.getpid()}"
"""This process, as Django's ``worker_ids`` name it."""


class TaskCall(msgspec.Struct, forbid_unknown_fields=True):
    """A Django task's call as Cyclone stores it: its arguments, and the options of the
    ``Task`` it was enqueued with, so that its result names the same task."""

    args: list[Any]
    kwargs: dict[str, Any]
    backend: str
    queue_name: str
    priority: int
    run_after: dt.datetime | None = None


class TaskReturn(msgspec.Struct, forbid_unknown_fields=True):
    """A Django task's output as Cyclone stores it: the return value, when the attempt that
    returned it started, and the worker that ran it."""

    value: Any
    started_at: dt.datetime
    worker_id: str


_lock = threading.Lock()
_tasks: dict[str, Task[Any, Any]] = {}
_steps: dict[str, Step[TaskCall, TaskReturn]] = {}


def remember(task: Task[Any, Any]) -> None:
    """Keep ``task`` (Django validates every ``Task`` its backend makes): the worker serves
    every task this process has defined. The first definition of a path is kept."""
    with _lock:
        _tasks.setdefault(task.module_path, task)


def known_tasks() -> list[Task[Any, Any]]:
    """The tasks this process has defined for a Cyclone backend, by module path."""
    with _lock:
        return [_tasks[path] for path in sorted(_tasks)]


def known_task(path: str) -> Task[Any, Any] | None:
    """The task at module path ``path``: one this process defined, or else the ``Task`` its
    module defines once imported (as Django rebuilds a pickled task); None if neither."""
    with _lock:
        task = _tasks.get(path)
    if task is None:
        try:
            found = import_string(path)
        except ImportError:
            return None
        task = found if isinstance(found, Task) else None
    return task


def step_of(task: Task[Any, Any], *, max_attempts: int) -> Step[TaskCall, TaskReturn]:
    """The Cyclone step that runs ``task``, made once per module path."""
    path = task.module_path
    with _lock:
        step = _steps.get(path)
        if step is None:
            step = Step(
                path,
                _async_handler(task) if inspect.iscoroutinefunction(task.func) else _handler(task),
                queue=task.queue_name,
                priority=task.priority,
                max_attempts=max_attempts,
            )
            _steps[path] = step
        return step


def task_of(task: Task[Any, Any], call: TaskCall) -> Task[Any, Any]:
    """``task`` with the options of ``call``."""
    return task.using(
        priority=call.priority,
        queue_name=call.queue_name,
        run_after=call.run_after,
        backend=call.backend,
    )


def _running(
    task: Task[Any, Any], ctx: Context, call: TaskCall, started: dt.datetime
) -> TaskResult[Any, Any]:
    result: TaskResult[Any, Any] = TaskResult(
        task=task_of(task, call),
        id=str(ctx.run_id),
        status=TaskResultStatus.RUNNING,
        enqueued_at=None,
        started_at=started,
        finished_at=None,
        last_attempted_at=started,
        args=call.args,
        kwargs=call.kwargs,
        backend=call.backend,
        errors=[],
        worker_ids=[WORKER_ID] * ctx.attempt,
    )
    task_started.send(sender=type(result.task.get_backend()), task_result=result)
    return result


def _arguments(task: Task[Any, Any], result: TaskResult[Any, Any], call: TaskCall) -> list[Any]:
    return [TaskContext(task_result=result), *call.args] if task.takes_context else call.args


def _finished(result: TaskResult[Any, Any], status: TaskResultStatus, value: Any = None) -> None:
    """Send ``task_finished`` for an attempt that ends the task: its success, or its last
    failure (an attempt to be retried leaves it ready, not finished)."""
    object.__setattr__(result, "status", status)
    object.__setattr__(result, "finished_at", timezone.now())
    object.__setattr__(result, "_return_value", value)
    task_finished.send(sender=type(result.task.get_backend()), task_result=result)


class TaskExited(Exception):
    """What a task that raised ``SystemExit`` (``sys.exit()``) fails with: the attempt
    fails, and the worker runs on."""


def _failure(ctx: Context, result: TaskResult[Any, Any], exc: BaseException) -> BaseException:
    """The error the attempt fails with (``exc``, or :class:`TaskExited` for ``SystemExit``);
    ``task_finished`` is sent if it was the last attempt."""
    if ctx.attempt >= ctx.max_attempts:
        _finished(result, TaskResultStatus.FAILED)
    if isinstance(exc, SystemExit):
        return TaskExited(f"the task raised SystemExit({exc.code!r})")
    return exc


def _handler(task: Task[Any, Any]) -> Callable[[Context, TaskCall], TaskReturn]:
    def run_task(ctx: Context, call: TaskCall) -> TaskReturn:
        # In a worker thread, as a request is in its own: Django's connections of this
        # thread are closed if they are too old or broken, before and after.
        close_old_connections()
        try:
            started = timezone.now()
            result = _running(task, ctx, call, started)
            try:
                value = json_value(task.func(*_arguments(task, result, call), **call.kwargs))
            except (Exception, SystemExit) as exc:
                if (failure := _failure(ctx, result, exc)) is exc:
                    raise
                raise failure from exc
            _finished(result, TaskResultStatus.SUCCESSFUL, value)
            return TaskReturn(value, started, WORKER_ID)
        finally:
            close_old_connections()

    return run_task


def _async_handler(task: Task[Any, Any]) -> Callable[[Context, TaskCall], Any]:
    async def run_task(ctx: Context, call: TaskCall) -> TaskReturn:
        started = timezone.now()
        result = _running(task, ctx, call, started)
        try:
            value = json_value(await task.func(*_arguments(task, result, call), **call.kwargs))
        except (Exception, SystemExit) as exc:
            if (failure := _failure(ctx, result, exc)) is exc:
                raise
            raise failure from exc
        _finished(result, TaskResultStatus.SUCCESSFUL, value)
        return TaskReturn(value, started, WORKER_ID)

    return run_task
