"""POST /orders: save the order and submit its fulfilment in one ``atomic()`` block.

Cyclone writes through Django's own connection, so the order and the run commit together or
not at all; the workers' wakeup goes out from ``transaction.on_commit``. A retried request
(same ``Idempotency-Key``) gets the first request's run and writes nothing.
"""

from __future__ import annotations

import msgspec
from django.db import connection, transaction
from django.http import HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

import cyclone
import cyclone.sync
from examples.django_app.shop.models import Order
from examples.orders import Fulfil, NewOrder, fulfil

client = cyclone.sync.Client(connection)  # Django's connection, per thread


@csrf_exempt
@require_POST
def create_order(request: HttpRequest) -> JsonResponse:
    key = request.headers.get("Idempotency-Key")
    if not key:
        return JsonResponse({"error": "an Idempotency-Key header is needed"}, status=400)
    try:
        order = msgspec.json.decode(request.body, type=NewOrder)
    except msgspec.ValidationError as exc:
        return JsonResponse({"error": str(exc)}, status=422)
    job = Fulfil(key, order.customer, order.cents)
    try:
        with transaction.atomic():
            # Submit first: a retry waits here for the first request's transaction.
            run, created = client.submit_once_tx(connection, fulfil, f"order:{key}", job)
            if created:
                Order.objects.create(key=key, customer=order.customer, cents=order.cents)
    except cyclone.SubmitConflictError as exc:
        return JsonResponse({"error": f"key already used for run {exc.run_id}"}, status=409)
    body = {"run_id": str(run.id), "created": created}
    return JsonResponse(body, status=201 if created else 200)
