"""Fixtures for the dashboard's tests: an httpx client on the ASGI app, runs in known states."""

from __future__ import annotations

import re
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

import cyclone
import cyclone.web
from cyclone.testing.plugin import CycloneEnv
from tests.web.flows import FAILING, HOSTILE, STEPS, WORKFLOWS, pipeline

CSRF = re.compile(r'name="csrf" value="([0-9a-f]+)"')


@pytest.fixture(autouse=True)
def _charge_fails() -> None:
    FAILING["charge"] = True


@dataclass
class Dash:
    """An httpx client on a dashboard, and the CSRF token of the last page it read."""

    http: httpx.AsyncClient
    csrf: str = ""

    async def get(self, path: str, **kwargs: Any) -> httpx.Response:
        response = await self.http.get(path, **kwargs)
        if found := CSRF.search(response.text):
            self.csrf = found[1]
        return response

    async def post(self, path: str, data: dict[str, Any], **kwargs: Any) -> httpx.Response:
        return await self.http.post(path, data={"csrf": self.csrf, **data}, **kwargs)


Make = Callable[..., Any]


@pytest.fixture
def make_dash(cyclone_env: CycloneEnv) -> Make:
    """``async with make_dash(host="127.0.0.1", **dashboard_options) as dash:``."""

    @asynccontextmanager
    async def make(host: str = "127.0.0.1", **options: Any) -> AsyncIterator[Dash]:
        app = cyclone.web.dashboard(cyclone_env.client, **options)
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url=f"http://{host}") as http:
            yield Dash(http)

    return make


async def failed_run(env: CycloneEnv, order: dict[str, Any] | None = None) -> uuid.UUID:
    """A pipeline run whose charge node failed with the hostile message."""
    run = await pipeline.submit(env.client, order or {"id": 1, "note": HOSTILE})
    # Waited for, not drained: an attempt lost on a loaded machine is retried after a backoff,
    # which a drain does not wait for.
    async with env.worker(steps=STEPS, workflows=WORKFLOWS):
        assert await run.wait(timeout=60) is cyclone.RunState.FAILED
    return run.id
