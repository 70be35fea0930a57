"""A user's Django ``TestCase`` on the Cyclone backend, run by tests/djangotasks (it is not
a test module itself: pytest runs it through ``unittest`` on the test's database)."""

from __future__ import annotations

from django.test import TestCase

from cyclone.integrations.django.framework import TaskResultStatus
from tests.djangotasks.notes import tasks


class EnqueueInATestCase(TestCase):
    """A ``TestCase`` runs each test in a transaction that it rolls back: an enqueued task's
    job is written and readable in it, its wakeup is registered but never runs, and the job
    is gone with the rollback."""

    def test_the_task_is_written_in_the_test_transaction(self) -> None:
        with self.captureOnCommitCallbacks() as wakeups:
            result = tasks.calculate_meaning_of_life.enqueue()
        result.refresh()
        self.assertEqual(result.status, TaskResultStatus.READY)
        self.assertEqual(len(wakeups), 1)
