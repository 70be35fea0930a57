"""Settings of the Django project of the tasks tests: the example app's settings, plus an
app with tasks (``notes``), Cyclone's app and ``TASKS`` on ``CycloneBackend``. The example's
settings are kept so that one Django set up in a test process serves both."""

from __future__ import annotations

import importlib.util

from examples.django_app.settings import *  # noqa: F403
from examples.django_app.settings import INSTALLED_APPS

INSTALLED_APPS = [*INSTALLED_APPS, "tests.djangotasks.notes", "cyclone.integrations.django"]
if importlib.util.find_spec("django.tasks") is None:  # Django < 6: the backport is an app
    INSTALLED_APPS.append("django_tasks")

TASKS = {
    "default": {
        "BACKEND": "cyclone.integrations.django.CycloneBackend",
        "QUEUES": ["default", "emails"],
    }
}
