"""An order service on Flask: the order row and its workflow run commit together.

    cyclone migrate --dsn postgresql://...         # once: Cyclone's tables
    CYCLONE_DATABASE_URL=postgresql://... flask --app examples.flask_app.app run
    CYCLONE_DATABASE_URL=postgresql://... cyclone worker examples.orders:fulfil ...

Handlers are synchronous, so they use ``cyclone.sync.Client`` on a psycopg pool; the workers
are asyncio processes of their own (``cyclone worker``). POST /orders needs an
``Idempotency-Key`` header: a retried POST returns the same run and writes one order row.
"""

from __future__ import annotations

import os
import uuid
from typing import Any

import msgspec
import psycopg
import psycopg_pool
from flask import Flask, request

import cyclone
import cyclone.sync
from examples.orders import SCHEMA, Fulfil, NewOrder, fulfil


def create_app(dsn: str | None = None) -> Flask:
    """The app, with its pool and client in ``app.extensions`` (close the pool at exit)."""
    app = Flask(__name__)
    pool = psycopg_pool.ConnectionPool(
        dsn or os.environ["CYCLONE_DATABASE_URL"], min_size=1, max_size=8, open=True
    )
    client = cyclone.sync.Client(pool)
    with pool.connection() as conn:
        conn.execute(SCHEMA)
    app.extensions["cyclone.pool"], app.extensions["cyclone"] = pool, client

    @app.post("/orders")
    def create_order() -> tuple[dict[str, Any], int]:
        key = request.headers.get("Idempotency-Key")
        if not key:
            return {"error": "an Idempotency-Key header is needed"}, 400
        try:
            order = msgspec.json.decode(request.get_data(), type=NewOrder)
        except msgspec.ValidationError as exc:
            return {"error": str(exc)}, 422
        try:
            with pool.connection() as conn:
                run, created = place_order(client, conn, key, order)
        except cyclone.SubmitConflictError as exc:
            return {"error": f"key already used for run {exc.run_id}"}, 409
        except cyclone.InvalidKeyError as exc:
            return {"error": str(exc)}, 400
        return {"run_id": str(run.id), "created": created}, 201 if created else 200

    @app.get("/runs/<run_id>")
    def get_run(run_id: str) -> tuple[dict[str, Any], int]:
        try:
            run = client.get_run(uuid.UUID(run_id), str)
        except (ValueError, cyclone.RunNotFoundError):
            return {"error": "no such run"}, 404
        state = run.status()
        result = run.result() if state is cyclone.RunState.COMPLETED else None
        return {"state": state.value, "result": result}, 200

    return app


def place_order(
    client: cyclone.sync.Client, conn: psycopg.Connection[Any], key: str, order: NewOrder
) -> tuple[cyclone.sync.ResultRun[str], bool]:
    """Write the order and submit its fulfilment in one tracked transaction (the same
    pattern as ``examples.orders.place_order``, synchronous)."""
    job = Fulfil(key, order.customer, order.cents)
    with client.transaction(conn) as tx:  # wakes the workers after the commit
        # Submit first: a retry waits here for the first request's transaction.
        run, created = client.submit_once_tx(tx, fulfil, f"order:{key}", job)
        if created:
            tx.execute(
                "INSERT INTO orders (key, customer, cents) VALUES (%s, %s, %s)",
                (key, order.customer, order.cents),
            )
    return run, created
