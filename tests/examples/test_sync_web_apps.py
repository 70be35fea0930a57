"""The Flask and Django examples against a real database: a retried POST is one order row and
one run, and an asyncio worker completes the run the synchronous handler submitted."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import asyncpg
import pytest

import cyclone
from cyclone.testing.plugin import TEST_WORKER_OPTIONS, CycloneEnv
from examples.orders import fulfil

Post = Callable[[dict[str, Any], str], tuple[int, dict[str, Any]]]


@contextmanager
def flask_post(env: CycloneEnv) -> Iterator[Post]:
    from examples.flask_app.app import create_app

    app = create_app(env.dsn)
    http = app.test_client()

    def post(body: dict[str, Any], key: str) -> tuple[int, dict[str, Any]]:
        response = http.post("/orders", json=body, headers={"Idempotency-Key": key})
        return response.status_code, response.get_json()

    try:
        yield post
    finally:
        app.extensions["cyclone.pool"].close()


@contextmanager
def django_post(env: CycloneEnv) -> Iterator[Post]:
    from django.core.management import call_command
    from django.db import connections
    from django.test import Client

    from tests.frameworks.sync_styles import configure_django

    configure_django(env.dsn)
    call_command("migrate", "shop", verbosity=0)
    http = Client()

    def post(body: dict[str, Any], key: str) -> tuple[int, dict[str, Any]]:
        response = http.post(
            "/orders", json.dumps(body), content_type="application/json", HTTP_IDEMPOTENCY_KEY=key
        )
        return response.status_code, json.loads(response.content)

    try:
        yield post
    finally:
        connections.close_all()


async def _completed(dsn: str, run_id: uuid.UUID) -> cyclone.RunState:
    """Serve the order workflow until the run ends (a loop and a pool of this call's own)."""
    async with asyncpg.create_pool(dsn, min_size=1, max_size=4) as pool:
        client = cyclone.Client(pool)
        worker = cyclone.Worker(client, workflows=[fulfil], **TEST_WORKER_OPTIONS)
        async with worker:
            return await cyclone.Run(client, run_id).wait(timeout=60)


@pytest.mark.parametrize("make_post", [flask_post, django_post], ids=["flask", "django"])
def test_sync_order_service(cyclone_env: CycloneEnv, make_post: Any) -> None:
    order = {"customer": "ada", "cents": 1200}
    with make_post(cyclone_env) as post:
        status, first = post(order, "abc-1")
        assert (status, first["created"]) == (201, True)
        # The client retries: same key, same body. Same run, nothing new written.
        status, retry = post(order, "abc-1")
        assert (status, retry) == (200, {"run_id": first["run_id"], "created": False})
        status, _ = post({"customer": "ada", "cents": 1}, "abc-1")
        assert status == 409
        status, _ = post({"customer": "ada"}, "abc-2")
        assert status == 422
        run_id = uuid.UUID(first["run_id"])
        assert asyncio.run(_completed(cyclone_env.dsn, run_id)) is cyclone.RunState.COMPLETED
        rows = asyncio.run(_orders(cyclone_env.dsn))
    assert rows == [("abc-1", True)]  # one order row, paid once
    runs = asyncio.run(_runs(cyclone_env.dsn))
    assert runs == [(run_id, "completed")]  # one run


async def _orders(dsn: str) -> list[tuple[Any, ...]]:
    conn = await asyncpg.connect(dsn)
    try:
        return [tuple(r) for r in await conn.fetch("SELECT key, paid FROM orders")]
    finally:
        await conn.close()


async def _runs(dsn: str) -> list[tuple[Any, ...]]:
    conn = await asyncpg.connect(dsn)
    try:
        return [tuple(r) for r in await conn.fetch("SELECT id, state FROM cyclone_runs")]
    finally:
        await conn.close()
