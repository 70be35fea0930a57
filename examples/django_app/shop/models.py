"""The business row: an order, keyed by the client's idempotency key.

It is the ``orders`` table of the other examples (``examples.orders``), whose ``charge`` step
marks it paid in its completion transaction.
"""

from __future__ import annotations

from django.db import models


class Order(models.Model):
    # Annotated for mypy with django-stubs and no Django plugin (no settings to load).
    key: models.TextField[str, str] = models.TextField(primary_key=True)
    customer: models.TextField[str, str] = models.TextField()
    cents: models.PositiveIntegerField[int, int] = models.PositiveIntegerField()
    paid: models.BooleanField[bool, bool] = models.BooleanField(default=False)

    class Meta:
        db_table = "orders"
