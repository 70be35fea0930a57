"""Django: its database connection as the caller's transaction (``cyclone.sync``, in
``connection``), and a backend for its tasks framework (``CycloneBackend``), whose worker is
the ``cyclone_worker`` command of this package as a Django app.

``CycloneBackend`` is imported on first use: the connection adapter needs no tasks framework.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from cyclone.integrations.django.connection import ADAPTER

if TYPE_CHECKING:
    from cyclone.integrations.django.backend import CycloneBackend

__all__ = ["ADAPTER", "CycloneBackend"]


def __getattr__(name: str) -> Any:
    # TASKS = {"default": {"BACKEND": "cyclone.integrations.django.CycloneBackend"}}
    if name == "CycloneBackend":
        from cyclone.integrations.django.backend import CycloneBackend

        return CycloneBackend
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
