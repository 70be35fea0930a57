"""The tasks of the notes app, defined with Django's ``@task`` on the Cyclone backend."""

from __future__ import annotations

import asyncio
import sys
import threading
from typing import Any

from django.db import transaction
from django.db.models import F

from cyclone.integrations.django.framework import TaskContext, task
from tests.djangotasks.notes.models import Note, Ran

STARTED = threading.Event()
"""Set by ``hold`` once it runs (an in-process worker runs it in a thread of this process)."""
RELEASE = threading.Event()
"""What ``hold`` waits for before it returns."""


class NoteError(Exception):
    """A failure of the application's own."""


@task
def mark_done(note_id: int) -> str:
    """Count one run of the note's task; its text."""
    Note.objects.filter(id=note_id).update(runs=F("runs") + 1)
    return Note.objects.get(id=note_id).text


@task(queue_name="default")
def record(label: str) -> None:
    """Log that this task ran."""
    Ran.objects.create(label=label)


@task
def calculate_meaning_of_life() -> int:
    return 42


@task
def fail(message: str) -> None:
    raise NoteError(message)


@task
def fail_builtin() -> None:
    raise ValueError("This Task failed due to ValueError")


@task
def exits() -> None:
    sys.exit(3)


@task
def complex_return_value() -> Any:
    return {"not json": object()}


@task(takes_context=True)
def who_am_i(context: TaskContext, word: str) -> dict[str, Any]:
    return {"id": context.task_result.id, "attempt": context.attempt, "word": word}


@task
def hold() -> str:
    """Run until the test releases it."""
    STARTED.set()
    return "released" if RELEASE.wait(60) else "never released"


@task(takes_context=True)
def flaky(context: TaskContext) -> int:
    """Fail the first attempt; the number of the one that succeeds."""
    if context.attempt == 1:
        raise NoteError("the first attempt fails")
    return context.attempt


@task
async def double(n: int, *, twice: bool = True) -> int:
    await asyncio.sleep(0)
    return n * 2 if twice else n


def create_note(text: str, *, fail: bool = False) -> int:
    """A view's work: save a note and enqueue its task in one transaction."""
    with transaction.atomic():
        note = Note.objects.create(text=text)
        mark_done.enqueue(note.id)
        if fail:
            raise NoteError("the view failed after enqueueing")
    return note.id
