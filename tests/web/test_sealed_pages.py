"""The dashboard on sealed payloads: opened when its client has the key, redacted (with
the key's id) when it has not."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx

import cyclone
import cyclone.web
from cyclone.testing.plugin import CycloneEnv
from tests.conftest import fast_worker
from tests.web.flows import STEPS, WORKFLOWS, pipeline

KEY = cyclone.Keyring.generate_key()
SECRET = "order-note-7731"


@asynccontextmanager
async def dashboard_of(client: cyclone.Client) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=cyclone.web.dashboard(client))
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as http:
        yield http


async def test_run_page_opens_or_redacts(cyclone_env: CycloneEnv) -> None:
    keyring = cyclone.Keyring({"k1": KEY}, current="k1")
    async with cyclone.Client(cyclone_env.pool, cipher=keyring) as client:
        run = await pipeline.submit(client, {"id": 1, "note": SECRET})
        async with fast_worker(client, steps=STEPS, workflows=WORKFLOWS):
            assert await run.wait(timeout=60) is cyclone.RunState.FAILED
        async with dashboard_of(client) as http:
            html = (await http.get(f"/runs/{run.id}")).text
        assert SECRET in html and "card declined" in html  # input and error message
        assert "encrypted with key" not in html
    async with dashboard_of(cyclone_env.client) as http:  # a client without the keyring
        page = await http.get(f"/runs/{run.id}")
    assert page.status_code == 200
    assert SECRET not in page.text and "card declined" not in page.text
    assert "&lt;encrypted with key k1&gt;" in page.text
    assert "ValueError" in page.text  # the error's type stays clear
