"""The example's one route."""

from __future__ import annotations

from django.urls import path

from examples.django_app.shop.views import create_order

urlpatterns = [path("orders", create_order)]
