"""The FastAPI and aiohttp examples against a real database: a retried POST is one order."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest
from aiohttp.test_utils import TestClient, TestServer

import cyclone
from cyclone.testing.plugin import CycloneEnv

Post = Callable[[str, dict[str, Any], dict[str, str]], Awaitable[tuple[int, dict[str, Any]]]]
Get = Callable[[str], Awaitable[tuple[int, dict[str, Any]]]]


@asynccontextmanager
async def fastapi_client() -> AsyncIterator[tuple[Post, Get]]:
    from examples.fastapi_app.app import app

    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as http,
    ):

        async def post(path: str, body: dict[str, Any], headers: dict[str, str]) -> Any:
            response = await http.post(path, json=body, headers=headers)
            return response.status_code, response.json()

        async def get(path: str) -> Any:
            response = await http.get(path)
            return response.status_code, response.json()

        yield post, get


@asynccontextmanager
async def aiohttp_client() -> AsyncIterator[tuple[Post, Get]]:
    from examples.aiohttp_app.app import make_app

    async with TestClient(TestServer(make_app())) as http:

        async def post(path: str, body: dict[str, Any], headers: dict[str, str]) -> Any:
            response = await http.post(path, json=body, headers=headers)
            return response.status, await response.json(content_type=None)

        async def get(path: str) -> Any:
            response = await http.get(path)
            return response.status, await response.json(content_type=None)

        yield post, get


@pytest.mark.parametrize(
    "make_client", [fastapi_client, aiohttp_client], ids=["fastapi", "aiohttp"]
)
async def test_order_service(
    cyclone_env: CycloneEnv, monkeypatch: pytest.MonkeyPatch, make_client: Any
) -> None:
    monkeypatch.setenv("CYCLONE_DATABASE_URL", cyclone_env.dsn)
    order = {"customer": "ada", "cents": 1200}
    async with make_client() as (post, get):
        status, first = await post("/orders", order, {"Idempotency-Key": "abc-1"})
        assert (status, first["created"]) == (201, True)
        # The client retries: same key, same body. Same run, nothing new written.
        status, retry = await post("/orders", order, {"Idempotency-Key": "abc-1"})
        assert (status, retry) == (200, {"run_id": first["run_id"], "created": False})
        status, _ = await post(
            "/orders", {"customer": "ada", "cents": 1}, {"Idempotency-Key": "abc-1"}
        )
        assert status == 409
        status, _ = await post("/orders", {"customer": "ada"}, {"Idempotency-Key": "abc-2"})
        assert status == 422

        run = cyclone.Run(cyclone_env.client, uuid.UUID(first["run_id"]))
        assert await run.wait(timeout=60) is cyclone.RunState.COMPLETED
        status, body = await get(f"/runs/{first['run_id']}")
        assert status == 200
        assert body["state"] == "completed"
        assert body["result"] == "1200 cents charged to ada, shipping from shelf-3"
        status, _ = await get(f"/runs/{uuid.uuid4()}")
        assert status == 404
    rows = await cyclone_env.pool.fetch("SELECT key, paid FROM orders")
    assert [tuple(r) for r in rows] == [("abc-1", True)]  # one order row, paid once


async def test_fastapi_app_mounts_the_dashboard_behind_basic_auth(
    cyclone_env: CycloneEnv, monkeypatch: pytest.MonkeyPatch
) -> None:
    from examples.fastapi_app.app import app

    monkeypatch.setenv("CYCLONE_DATABASE_URL", cyclone_env.dsn)
    monkeypatch.setenv("DASHBOARD_PASSWORD", "s3cret")
    transport = httpx.ASGITransport(app=app)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=transport, base_url="http://t") as http,
    ):
        order = {"customer": "<b>ada</b>", "cents": 5}
        made = await http.post("/orders", json=order, headers={"Idempotency-Key": "k-1"})
        run_id = made.json()["run_id"]
        anonymous = await http.get("/jobs/")
        assert anonymous.status_code == 401 and anonymous.headers["www-authenticate"] == "Basic"
        wrong = await http.get("/jobs/", auth=("admin", "guess"))
        assert wrong.status_code == 403
        page = await http.get(f"/jobs/runs/{run_id}", auth=("admin", "s3cret"))
        assert page.status_code == 200
        assert "&lt;b&gt;ada&lt;/b&gt;" in page.text and "<b>ada</b>" not in page.text
        assert f'action="/jobs/runs/{run_id}/cancel"' in page.text  # authorized: actions on
    assert not [r for r in app.routes if getattr(r, "name", "") == "jobs"]
