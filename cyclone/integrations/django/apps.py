"""The Django app of Cyclone's integration: add ``"cyclone.integrations.django"`` to
``INSTALLED_APPS`` for the ``cyclone_worker`` management command."""

from __future__ import annotations

from django.apps import AppConfig


class CycloneConfig(AppConfig):
    """Cyclone's app: it has no models, only the ``cyclone_worker`` command."""

    name = "cyclone.integrations.django"
    label = "cyclone"
    verbose_name = "Cyclone"
