"""A note, and a log of what the tasks did (in the order they ran)."""

from __future__ import annotations

from django.db import models


class Note(models.Model):
    """A note that a task marks done, counting its runs."""

    text = models.TextField()
    runs = models.IntegerField(default=0)


class Ran(models.Model):
    """One run of the ``record`` task, by label, in the order the tasks ran."""

    label = models.TextField()
